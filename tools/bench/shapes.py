"""Issue #14's standard training shapes, and issue #39's MoE ones, as
experiments.

Each shape is a decoder of one family trained on random tokens (data.source
"synthetic"), with data parallelism over all devices or, with `fsdp`,
parameters and batch split over all devices (MaxText's default mesh), and
with `expert` > 1 that many devices on the `expert` mesh axis (expert
parallelism: the MoE layers' experts split over it, the batch too):

  tiny   Llama: emb 256, 4 heads of 64, 4 kv heads, MLP 1024, 2 layers,
         vocab 32000, seq 256, global batch 8 (18.5M parameters)
  small  Llama: emb 768, 12 heads of 64, 12 kv heads, MLP 3072, 6 layers,
         vocab 32000, seq 512, global batch `small_batch` (about 106M)
  llama3-8b  Llama 3 8B's widths (emb 4096, 32 heads of 128, 8 kv heads,
         MLP 14336, vocab 128256, seq 8192) at reduced depth, 4 of its 32
         layers (1.9B parameters), global batch `small_batch`: for a GPU
         (`gpu_h200.sh`), too large to train on these CPUs
  mixtral-tiny  Mixtral: emb 256, 4 heads of 64, 2 kv heads, 4 layers of 8
         experts with MLP 512, 2 per token (dropless), vocab 32000, seq 256,
         global batch 8
  deepseek-tiny  DeepSeek-V3: emb 256, 4 layers (the first dense, MLP 512),
         multi-head latent attention (4 heads, query rank 64, key/value
         rank 64, 32 + 16 query/key and 32 value widths), 16 routed experts
         with MLP 128 in 4 groups, 4 per token from 2 groups, sigmoid
         scores with a bias, 1 shared expert (dropless), no multi-token
         prediction, vocab 32000, seq 256, global batch 8
"""

import types

from absl import flags
import ml_collections

from configs import deepseek3
from configs import llama3
from configs import mixtral
from maxtext.layers import remat as remat_lib
from maxtext.trainers import config as config_lib

# The model and data fields each shape sets (`seq_len` goes to data) on its
# family's config (`FAMILIES`, else Llama 3's).
SHAPES = {
    "tiny": dict(embed_dim=256, num_heads=4, num_kv_heads=4, head_dim=64,
                 mlp_dim=1024, num_layers=2, vocab_size=32_000, seq_len=256),
    "small": dict(embed_dim=768, num_heads=12, num_kv_heads=12, head_dim=64,
                  mlp_dim=3072, num_layers=6, vocab_size=32_000, seq_len=512),
    "llama3-8b": dict(embed_dim=4096, num_heads=32, num_kv_heads=8,
                      head_dim=128, mlp_dim=14336, num_layers=4,
                      vocab_size=128_256, seq_len=8192),
    "mixtral-tiny": dict(embed_dim=256, num_heads=4, num_kv_heads=2,
                         head_dim=64, mlp_dim=512, moe_mlp_dim=512,
                         num_layers=4, num_experts=8, num_experts_per_token=2,
                         vocab_size=32_000, seq_len=256),
    "deepseek-tiny": dict(
        embed_dim=256, num_heads=4, num_kv_heads=4, head_dim=16,
        q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, v_head_dim=32,
        mlp_dim=512, moe_mlp_dim=128, num_layers=4, first_dense_layers=1,
        num_experts=16, num_experts_per_token=4, num_expert_groups=4,
        expert_groups_per_token=2, num_shared_experts=1, mtp_layers=0,
        rope_scaling_factor=4.0, rope_original_max_length=64,
        vocab_size=32_000, seq_len=256),
}
FAMILIES: dict[str, types.ModuleType] = {"mixtral-tiny": mixtral,
                                         "deepseek-tiny": deepseek3}
# The shapes whose global batch is `small_batch`; the others' is 8.
_SMALL_BATCH_SHAPES = ("small", "llama3-8b")


def global_batch(shape: str, small_batch: int) -> int:
  """Global batch of `shape`: `small_batch` for `small` and `llama3-8b`,
  else 8."""
  return small_batch if shape in _SMALL_BATCH_SHAPES else 8


def validate_shapes_flag(name: str) -> None:
  """Makes list flag --`name` accept only names of `SHAPES`."""
  flags.register_validator(
      name, lambda shapes: set(shapes) <= set(SHAPES),
      message=f"--{name} takes shapes of {sorted(SHAPES)}.")


class LayoutFlags:
  """Defines the --fsdp, --expert and --remat flags of a binary that runs
  one of the shapes (once per binary)."""

  def __init__(self):
    self.fsdp = flags.DEFINE_bool(
        "fsdp", False, "Split parameters and batch over all devices (FSDP)"
        " instead of data parallelism.")
    self.expert = flags.DEFINE_integer(
        "expert", 1, "Devices on the expert mesh axis (expert parallelism"
        " for the MoE shapes); the rest go to data, or fsdp with --fsdp.",
        lower_bound=1)
    self.remat = flags.DEFINE_enum("remat", "none", remat_lib.POLICIES,
                                   "Remat policy (maxtext.layers.remat).")

  def settings(self) -> dict[str, object]:
    """`config_dict`'s fsdp, expert and remat arguments, as parsed."""
    return dict(fsdp=self.fsdp.value, expert=self.expert.value,
                remat=self.remat.value)


def config_dict(shape: str, dtype: str, small_batch: int = 8, *,
                fsdp: bool = False, expert: int = 1,
                attention_impl: str = "auto", attention_block: int = 512,
                remat: str = "none") -> ml_collections.ConfigDict:
  """The config of standard shape `shape` in `dtype` (FSDP with `fsdp`,
  `expert` devices on the expert axis), attention by `attention_impl`
  (`maxtext.kernels.dispatch.IMPLS`) with query and key tiles of
  `attention_block`, remat policy `remat` (`maxtext.layers.remat`).

  Raises:
    ValueError: an unknown shape (names the valid ones).
  """
  if shape not in SHAPES:
    raise ValueError(f"Unknown shape {shape!r}; valid: {sorted(SHAPES)}.")
  fields = dict(SHAPES[shape])
  config = FAMILIES.get(shape, llama3).get_config()
  config.data.seq_len = fields.pop("seq_len")
  config.model.update(dict(fields, tie_embeddings=False, dtype=dtype))
  config.data.source = "synthetic"
  config.train.batch_size = global_batch(shape, small_batch)
  config.attention_kernel.update(dict(impl=attention_impl,
                                      block_q=attention_block,
                                      block_kv=attention_block))
  config.remat.policy = remat
  if fsdp:
    config.mesh.ici.data = 1
    config.mesh.ici.fsdp = -1
  config.mesh.ici.expert = expert
  return config


def experiment_config(shape: str, dtype: str, small_batch: int = 8,
                      **settings) -> config_lib.ExperimentConfig:
  """`config_dict(shape, dtype, small_batch, **settings)` as an experiment.

  Raises:
    ValueError: an unknown shape, or a value the config rejects (each
      names the valid ones).
  """
  return config_lib.ExperimentConfig.from_config_dict(
      config_dict(shape, dtype, small_batch, **settings))
