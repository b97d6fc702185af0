"""DeepSeek-V3: logits and weights equal Hugging Face's; published parameter
counts; multi-token prediction in the train step.

Greedy generation against transformers' is in
`maxtext/inference/hf_generate_test.py` (every family of
`testing/hf_tiny_models.py`).
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import common
from configs import deepseek3 as deepseek3_config
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.metrics import flops
from maxtext.models import deepseek3
from maxtext.models import execution
from maxtext.models import registry
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import hf_reference
from testing import hf_tiny_models

_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


class DeepSeek3HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model = hf_tiny_models.tiny_hf_model("deepseek3")
    cls.cfg = deepseek3.model_config_from_hf(cls.hf_model.config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(
        (cfg.attention.type, cfg.mla.q_lora_rank, cfg.mla.kv_lora_rank,
         cfg.mla.qk_nope_head_dim, cfg.attention.head_dim, cfg.mla.v_head_dim),
        ("mla", 24, 16, 12, 8, 10))
    self.assertEqual(
        (cfg.moe.num_experts, cfg.moe.num_experts_per_token,
         cfg.moe.num_shared_experts,
         cfg.pattern.first_dense_layers, cfg.moe.num_expert_groups,
         cfg.moe.expert_groups_per_token), (8, 2, 1, 1, 4, 2))
    self.assertTrue(cfg.mla.rope_interleave and cfg.moe.router_bias)
    self.assertEqual((cfg.rope.scaling, cfg.rope.yarn_mscale_all_dim),
                     ("yarn", 1.0))
    self.assertEqual(deepseek3.model_config_from_hf(
        deepseek3.hf_config_from_model_config(cfg)), cfg)

  # The xla kernel pads the 10-wide values to the 20-wide query-key heads.
  @parameterized.parameters((True, "reference"), (False, "reference"),
                            (True, "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_unsupported_settings_are_rejected(self):
    hf = self.hf_model.config.to_dict()
    for key, value in (("scoring_func", "softmax"), ("hidden_act", "gelu"),
                       ("num_key_value_heads", 2)):
      with self.subTest(key=key), self.assertRaisesRegex(ValueError, key):
        deepseek3.model_config_from_hf({**hf, key: value})


def _count(cfg: ModelConfig, name_filter=lambda path: True) -> int:
  model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                       rngs=nnx.Rngs(0)))
  return sum(math.prod(leaf.shape) for path, leaf in
             jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))
             if name_filter(jax.tree_util.keystr(path)))


def _counts(variant: str) -> tuple[ModelConfig, int, int]:
  """(config without MTP, total parameters, activated parameters).

  Activated: what one token's forward pass multiplies by (attention, dense
  MLPs, router, its routed experts and the shared expert, output head) plus
  the norm scales; the embedding lookup is not counted.
  """
  cfg = ModelConfig.from_dict(
      deepseek3_config.get_config(variant).model).replace(mtp_layers=0)
  total = _count(cfg)
  moe_layers = cfg.num_layers - cfg.pattern.first_dense_layers
  idle = cfg.moe.num_experts - cfg.moe.num_experts_per_token
  unused = moe_layers * idle * (
      3 * cfg.embed_dim * cfg.moe.mlp_dim)
  active = total - unused - cfg.vocab_size * cfg.embed_dim
  return cfg, total, active


class DeepSeek3ParameterCountTest(absltest.TestCase):

  def test_deepseek_v3_671b_total_37b_activated(self):
    # Published: 671B total (without the 14B MTP module), 37B activated.
    cfg, total, active = _counts("671b")
    self.assertEqual(round(total / 1e9), 671)
    self.assertEqual(round(active / 1e9), 37)
    # The FLOP counter's matmul parameters: the activated ones without the
    # norm scales.
    norms = _count(cfg, lambda path: "scale" in path)
    self.assertEqual(flops.matmul_params(cfg), active - norms)
    # With MTP (one depth, plus the checkpoint's copies of the embedding
    # and output head): DeepSeek's 685B checkpoint, to the nearest 1B.
    mtp = _count(cfg.replace(mtp_layers=1)) - total
    copies = 2 * cfg.vocab_size * cfg.embed_dim
    self.assertLess(abs(total + mtp + copies - 685e9), 1e9)

  def test_kimi_k2_1t_total_32b_activated(self):
    _, total, active = _counts("kimi_k2")
    self.assertEqual(round(total / 1e12), 1)
    self.assertEqual(round(active / 1e9), 32)


_SEQ = 8


def _train_state(mtp_loss_weight: float):
  config = deepseek3_config.get_config("tiny")
  cfg = ModelConfig.from_dict(config.model).replace(
      vocab_size=64, embed_dim=32,
      mlp_dim=32, scan_layers=False, mtp_layers=2,
      mtp_loss_weight=mtp_loss_weight)
  opt_config = optimizer.OptimizerConfig(**config.optimizer.to_dict())
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(data=1)), jax.devices()[:1])
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
  return train_state_lib.create_train_state(
      cfg, execution=execution.Execution(
          attention_kernel=dispatch.Kernel(impl="reference")),
      seed=0, tx=optimizer.make_optimizer(opt_config, total_steps=10),
      schedule=optimizer.learning_rate_schedule(opt_config, total_steps=10),
      z_loss=0.0, mesh=mesh, rules=rules)


def _packed_batch():
  """Two rows; row 0 packs two documents (5 + 3 tokens), row 1 has padding."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(2, _SEQ + 1), dtype=np.int32)
  segment_ids = np.array([[1] * 5 + [2] * 3, [1] * _SEQ], np.int32)
  positions = np.array([list(range(5)) + list(range(3)), range(_SEQ)],
                       np.int32)
  mask = np.ones((2, _SEQ), np.int32)
  mask[1, 6:] = 0
  mask[0, 4] = 0  # The last token of the first document has no target.
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "mask": mask,
          "segment_ids": segment_ids, "positions": positions}


def _hand_mtp_loss(model, batch) -> float:
  """The mean over depths of each depth's cross-entropy, computed from the
  model's pieces (blocks run one by one) and numpy."""
  cfg = model.cfg
  positions, segments = batch["positions"], batch["segment_ids"]
  rotary = cfg.rope.global_rotary(jnp.asarray(positions),
                                  cfg.attention.head_dim)

  def block(b, x):
    return b(x, rotary, window=None, segment_ids_BL=jnp.asarray(segments))[0]

  tokens = batch["inputs"]
  x = model.embedder(jnp.asarray(tokens))
  for b in [*model.dense_blocks, *model.blocks]:
    x = block(b, x)
  h = model.final_norm(x)
  losses = []
  for depth, module in enumerate(model.mtp, 1):
    ahead = np.zeros_like(tokens)
    ahead[:, :-depth] = tokens[:, depth:]
    e = module.embed_norm(model.embedder(jnp.asarray(ahead)))
    h = block(module.block, module.projection(
        jnp.concatenate([e, module.hidden_norm(h)], axis=-1)))
    logits = np.asarray(model.head(module.final_norm(h)), np.float64)
    # Position i predicts token i + depth + 1 = targets[i + depth], counted
    # where that target counts and is in i's document.
    logits, targets = logits[:, :-depth], batch["targets"][:, depth:]
    weights = batch["mask"][:, depth:] * (
        segments[:, depth:] == segments[:, :-depth])
    log_z = np.log(np.exp(logits).sum(-1))
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    losses.append(((log_z - picked) * weights).sum() / weights.sum())
  return float(np.mean(losses))


class MultiTokenPredictionTest(absltest.TestCase):

  def test_mtp_loss_equals_a_hand_computation(self):
    state = _train_state(mtp_loss_weight=0.3)
    batch = _packed_batch()
    loss, _, _, stats = jax.jit(train_step_lib.loss_and_grads)(state, batch)
    want = _hand_mtp_loss(state.model(), batch)
    np.testing.assert_allclose(float(stats["mtp_loss"]), want, rtol=1e-5)
    # train/loss stays the main cross-entropy; train/mtp_loss is logged.
    _, metrics = train_step_lib.train_step(state, batch)
    self.assertEqual(float(metrics["train/loss"]), float(loss))
    np.testing.assert_allclose(float(metrics["train/mtp_loss"]), want,
                               rtol=1e-5)

  def test_gradients_reach_the_mtp_weights(self):
    batch = _packed_batch()
    grads = jax.jit(lambda s: train_step_lib.loss_and_grads(s, batch)[2])(
        _train_state(mtp_loss_weight=0.3))
    for depth in (0, 1):
      for path in (("projection", "kernel"), ("embed_norm", "scale"),
                   ("block", "attention", "kv_up", "kernel"),
                   ("block", "moe", "router", "kernel")):
        grad = grads["mtp"][depth]
        for name in path:
          grad = grad[name]
        self.assertGreater(float(jnp.abs(grad).max()), 1e-6, (depth, path))


if __name__ == "__main__":
  absltest.main()
