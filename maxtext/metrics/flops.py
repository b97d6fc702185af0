"""Training FLOPs per token and peak FLOP/s per device (for MFU).

Training FLOPs per token = 6 * (matmul parameters) + attention FLOPs, where
6 = 2 (multiply-add) * 3 (forward + two backward matmuls).

Matmul parameters per layer (D embed, H heads, G kv heads, K head dim,
F mlp dim, V vocab): attention projections D*H*K (query) + 2*D*G*K (key,
value) + H*K*D (output), gated MLP 3*D*F; plus the output head D*V once (tied
or not: the head is a matmul, the embedding lookup is not). Norm scales are
not matmuls. A mixture-of-experts layer counts only what one token uses:
its router D*E, the k routed experts it goes to and the shared experts,
3*D*F_e each (F_e = moe_mlp_dim); layers without experts (the first
`first_dense_layers`, those between `moe_layer_interval`) have the dense MLP,
and so do expert layers with `moe_with_mlp` (Gemma 4 26b-a4b), as well.
Each layer counts with its kind's sizes (`maxtext.common.layer_pattern`:
Gemma 4's global layers have their own head size; layers that share another
layer's keys and values have no key and value projections). Per-layer inputs
(`per_layer_input_dim` P, Gemma 4 e2b/e4b) add the model's projection
D*layers*P and each layer's gate and projection 2*D*P (their token
embedding is a lookup).

A Gated DeltaNet layer (`linear_attention`: G key heads of width K, H value
heads of width U) has projections D*G*K (query, key), D*H*U (value, output
gate), D*H (beta, decay) and H*U*D (output), and its convolutions
taps*(2*G*K + H*U) multiply-adds per token. In place of attention's scores
it runs the chunked gated delta rule (`maxtext.kernels.gated_delta_rule`),
per token and head, in chunks of C multiply-adds: its rows of the chunk's
key-key and query-key products 2*C*K, its share of inverting the chunk's
unit lower-triangular system by doubling (2*(ceil(log2 C) - 1) products of
C x C matrices: 2*(ceil(log2 C) - 1)*C*C) and of applying the inverse
C*(U+K), two reads and one write of the state 3*K*U, and its row of the
scores times the chunk's values C*U; 2 FLOPs each, times 3 for training,
whatever the length: work linear in it (`linear_chunk` C, the execution's
`attention_kernel.linear_chunk`).

DeepSeek Sparse Attention (MLA with `index_topk` k, DeepSeek-V3.2) runs in
the absorbed form: per query, its I indexer heads of width J score every
causal key (I*(J + 1) multiply-adds per key, (L + 1) / 2 keys on average)
with projections Q*I*J + D*(J + I) (Q the query latent), trained (its KL
loss, `maxtext.layers.mla`: 6 FLOPs each); then each of the H heads attends
to the min(i + 1, k) selected tokens over the latent Z and rotary key K
(logits Z + K, weighted sum Z: 6*H*(2Z + K) FLOPs per selected token in
training). The absorbed up-projections cost what the expanded ones do
(kv_b's parameters, counted as matmuls). In the dense warm-up
(`index_stage="warmup"`) only the indexer trains: attention covers every
causal key and the model's matmuls run forward only (2 FLOPs each).

A vision tower (`vision_flops_per_image`) counts per image (Llama 4: per
tile): its patch projection p*p*3*d per patch, layers 4*d*d + 2*d*F per
token (t patches, and Llama 4's class token), its bidirectional attention
4*t*d per token per layer, and the projector u*d*D (Llama 4: u*A*(F + A +
D), its adapter of width A on the pixel-shuffled tokens, then projection);
2 FLOPs per multiply-add, times 3 when it trains, once when frozen (forward
only).

Attention (scores Q.K and the weighted sum P.V): 2 * 2 * H * K FLOPs per
attended key in the forward pass, 3x that for training, so
12 * H * K * (mean keys attended per query) per layer. A causal layer over a
row of L tokens attends on average (L + 1) / 2 keys (the causal halving); a
sliding-window layer of window w < L attends min(i + 1, w) keys at position
i, on average w - w * (w - 1) / (2 * L). Windows come from
`layer_pattern.layers(cfg)`.
"""

import math
import re

import jax

from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig

# Dense bf16 peak FLOP/s per chip, matched against `device.device_kind` in
# order (first regex that matches wins). Sources: vendor datasheets (dense,
# no sparsity). Unknown kinds, including CPUs, have no peak: MFU is n/a.
PEAK_FLOPS_BY_DEVICE_KIND = (
    (r"TPU v4", 275e12),
    (r"TPU v5 ?lite|TPU v5e", 197e12),
    (r"TPU v5p|TPU v5", 459e12),
    (r"TPU v6 ?lite|TPU v6e", 918e12),
    (r"B200", 2250e12),
    (r"H200", 989e12),
    (r"H100 PCIe", 756e12),
    (r"H100", 989e12),
    (r"A100", 312e12),
)


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters used in matmuls by one token, output head included (and
  the multi-token prediction modules, which training runs too)."""
  layers = sum((linear_attention_params(cfg) if layer.kind.linear else
                attention_params(layer.kind.config(cfg),
                                 kv_shared=layer.kind.kv_shared)) +
               mlp_params_per_token(layer.kind.config(cfg),
                                    layer.kind.experts)
               for layer in layer_pattern.layers(cfg))
  # Per-layer inputs: the model's projection, each layer's gate and
  # projection.
  layers += 3 * cfg.num_layers * cfg.embed_dim * cfg.per_layer_input_dim
  head = cfg.embed_dim * cfg.vocab_size
  # Multi-token prediction depths: projection, one block (with experts when
  # the model has them), the shared head.
  mtp = cfg.mtp.layers * (2 * cfg.embed_dim**2 + attention_params(cfg) +
                          head + mlp_params_per_token(cfg,
                                                      cfg.moe.num_experts > 0))
  return layers + head + mtp


def attention_params(cfg: ModelConfig, *, kv_shared: bool = False) -> int:
  """Matmul parameters of one layer's attention (projections only);
  `kv_shared`: it reads another layer's keys and values."""
  if cfg.attention.type != "mla":
    # Values are the keys' projection with k_eq_v (Gemma 4's global layers).
    kv = 0 if kv_shared else 1 if cfg.attention.k_eq_v else 2
    return cfg.embed_dim * cfg.attention.head_dim * (
        2 * cfg.attention.num_heads + kv * cfg.attention.num_kv_heads)
  heads = cfg.attention.num_heads
  qk_dim = cfg.mla.qk_nope_head_dim + cfg.attention.head_dim
  if cfg.mla.q_lora_rank:
    query = cfg.mla.q_lora_rank * (cfg.embed_dim + heads * qk_dim)
  else:
    query = cfg.embed_dim * heads * qk_dim
  kv = (cfg.embed_dim * (cfg.mla.kv_lora_rank + cfg.attention.head_dim) +
        cfg.mla.kv_lora_rank * heads *
        (cfg.mla.qk_nope_head_dim + cfg.mla.v_head_dim))
  return query + kv + heads * cfg.mla.v_head_dim * cfg.embed_dim


def linear_attention_params(cfg: ModelConfig) -> int:
  """Matmul parameters of one Gated DeltaNet layer (projections only)."""
  linear = cfg.linear_attention
  keys = linear.num_key_heads * linear.key_head_dim
  values = linear.num_value_heads * linear.value_head_dim
  return cfg.embed_dim * (2 * keys + 3 * values +
                          2 * linear.num_value_heads)


def mlp_params_per_token(cfg: ModelConfig, experts: bool) -> int:
  """Matmul parameters of a layer's MLP (or its `experts`) one token
  uses."""
  dense = 3 * cfg.embed_dim * cfg.mlp.dim
  if not experts:
    return dense
  shared = cfg.moe.shared_mlp_dim or (cfg.moe.num_shared_experts *
                                      cfg.moe.mlp_dim)
  return (cfg.embed_dim * (cfg.moe.num_experts + 3 * cfg.moe.mlp_dim *
                           cfg.moe.num_experts_per_token + 3 * shared +
                           int(cfg.moe.shared_expert_gate))
          + (dense if cfg.moe.with_mlp else 0))


def mean_attended_keys(window: int | None, seq_len: int,
                       chunk: int | None = None) -> float:
  """Mean number of keys a query attends to in a causal row of `seq_len`
  (within a sliding `window`, or within its `chunk` of positions)."""
  if chunk is not None:
    whole, rest = divmod(seq_len, chunk)
    return (whole * chunk * (chunk + 1) + rest * (rest + 1)) / (2 * seq_len)
  if window is None or window >= seq_len:
    return (seq_len + 1) / 2
  return window - window * (window - 1) / (2 * seq_len)


def sparse_attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs of one DeepSeek Sparse Attention layer per token (module
  docstring): the indexer trained, latent attention over the selected
  tokens trained (in the dense warm-up, over every causal key, forward
  only)."""
  mla = cfg.mla
  heads, rope_dim = cfg.attention.num_heads, cfg.attention.head_dim
  indexer_projections = (mla.q_lora_rank * mla.index_num_heads *
                         mla.index_head_dim + cfg.embed_dim *
                         (mla.index_head_dim + mla.index_num_heads))
  indexer_scores = (mla.index_num_heads * (mla.index_head_dim + 1) *
                    mean_attended_keys(None, seq_len))
  per_token = heads * (2 * mla.kv_lora_rank + rope_dim)
  if mla.index_stage == "warmup":
    attention = 2 * per_token * mean_attended_keys(None, seq_len)
  else:
    attention = 6 * per_token * mean_attended_keys(mla.index_topk, seq_len)
  return 6 * (indexer_projections + indexer_scores) + attention


def attention_flops_per_token(cfg: ModelConfig, seq_len: int,
                              linear_chunk: int = 64) -> float:
  """Training FLOPs of attention scores and values (of a Gated DeltaNet
  layer, its delta rule in chunks of `linear_chunk` and convolutions), per
  token."""
  total = 0.0
  linear = cfg.linear_attention
  for layer in layer_pattern.layers(cfg):
    if layer.kind.linear:
      chunk = min(linear_chunk, seq_len)
      keys, values = linear.key_head_dim, linear.value_head_dim
      doublings = max(math.ceil(math.log2(chunk)) - 1, 0)
      per_head = (2 * chunk * keys + 2 * doublings * chunk * chunk +
                  chunk * (values + keys) + 3 * keys * values +
                  chunk * values)
      conv = linear.conv_taps * (2 * linear.num_key_heads * keys +
                                 linear.num_value_heads * values)
      total += 6 * (linear.num_value_heads * per_head + conv)
      continue
    kind_cfg = layer.kind.config(cfg)
    if kind_cfg.mla.index_topk:
      total += sparse_attention_flops_per_token(kind_cfg, seq_len)
      continue
    # Query-key and probability-value widths (they differ with MLA).
    qk_dim = kind_cfg.attention.head_dim + kind_cfg.mla.qk_nope_head_dim
    v_dim = kind_cfg.mla.v_head_dim or kind_cfg.attention.head_dim
    total += (6 * cfg.attention.num_heads * (qk_dim + v_dim) *
              mean_attended_keys(layer.window, seq_len, layer.chunk))
  return total


def training_flops_per_token(cfg: ModelConfig, seq_len: int,
                             linear_chunk: int = 64) -> float:
  """Forward + backward FLOPs per trained token at sequence length seq_len
  (Gated DeltaNet layers in chunks of `linear_chunk`; DeepSeek Sparse
  Attention's dense warm-up runs the frozen model forward only)."""
  per_param = 2 if cfg.mla.index_stage == "warmup" else 6
  return per_param * matmul_params(cfg) + attention_flops_per_token(
      cfg, seq_len, linear_chunk)


def peak_flops_per_device(device_kind: str | None = None,
                          override: float = 0.0) -> float:
  """Peak dense bf16 FLOP/s of one device; 0.0 when unknown (MFU is n/a).

  Args:
    device_kind: `jax.Device.device_kind`; None means the first device's.
    override: A positive value is returned as is
      (`config.logging.peak_flops_per_device`).
  """
  if override > 0:
    return float(override)
  if device_kind is None:
    device_kind = jax.devices()[0].device_kind
  for pattern, peak in PEAK_FLOPS_BY_DEVICE_KIND:
    if re.search(pattern, device_kind, flags=re.IGNORECASE):
      return peak
  return 0.0


def vision_flops_per_image(cfg: ModelConfig, *, trained: bool) -> float:
  """FLOPs of one image through the vision tower and the projector (0
  without a tower): forward, times 3 when they train (`trained`; a frozen
  tower computes no gradients)."""
  vision = cfg.vision
  if not vision.layers:
    return 0.0
  patches = vision.patches_per_side**2
  width = vision.embed_dim
  llama4 = vision.arch == "llama4"
  tokens = patches + int(llama4)  # Llama 4's class token.
  per_token = vision.layers * (4 * width * width + 2 * width * vision.mlp_dim
                               + 2 * tokens * width)
  if llama4:  # Pixel shuffle, the adapter's fc1 and fc2, the projection.
    adapter = vision.adapter_dim
    projector = vision.tokens_per_image * adapter * (
        vision.mlp_dim + adapter + cfg.embed_dim)
  else:
    projector = vision.tokens_per_image * width * cfg.embed_dim
  forward = 2 * (patches * 3 * vision.patch_size**2 * width +
                 tokens * per_token + projector)
  return forward * (3 if trained else 1)
