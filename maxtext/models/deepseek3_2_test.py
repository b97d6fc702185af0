"""DeepSeek-V3.2 (DeepSeek Sparse Attention) against transformers'
DeepseekV32ForCausalLM: logits of tiny random models at lengths far past
`index_topk` (each query attends to 4 of up to 100 tokens), stacked and
unstacked layers; the config and weights round trip; bad indexer sizes are
refused; the indexer's two training stages (dense warm-up with the rest
frozen, then sparse training in the same state) lower their losses through
the train step. Greedy decoding against transformers' `generate` is in
`maxtext/inference/hf_generate_test.py`, conversion in
`maxtext/checkpoint/hf_convert_test.py` (the family is in
`testing/hf_tiny_models.py`)."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from configs import deepseek3_2 as deepseek3_2_config
from maxtext.common.model_config import ModelConfig
from maxtext.layers import mla
from maxtext.models import deepseek3_2
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import hf_reference
from testing import hf_tiny_models
from testing import tiny_configs

_TOLERANCE = 1e-4


def _hf():
  hf_model = hf_tiny_models.tiny_hf_model("deepseek3_2")
  return hf_model, deepseek3_2.model_config_from_hf(
      hf_model.config.to_dict())


class HuggingFaceTest(parameterized.TestCase):

  @parameterized.parameters((True, 100), (False, 37))
  def test_logits_match(self, scan_layers, length):
    hf_model, cfg = _hf()
    self.assertEqual(cfg.mla.index_topk, 4)
    tokens = np.random.RandomState(0).randint(0, 128, size=(2, length))
    self.assertLessEqual(hf_reference.max_logit_diff(
        hf_model, cfg, tokens, scan_layers=scan_layers), _TOLERANCE)

  def test_config_and_weights_round_trip(self):
    hf_model, cfg = _hf()
    self.assertEqual((cfg.mla.index_num_heads, cfg.mla.index_head_dim),
                     (16, 16))
    self.assertEqual(deepseek3_2.model_config_from_hf(
        deepseek3_2.hf_config_from_model_config(cfg)), cfg)
    hf_reference.assert_round_trip(hf_model, cfg, scan_layers=True)

  @parameterized.parameters(
      (dict(index_num_heads=0), "index_num_heads=0"),
      (dict(index_head_dim=4), r"index_head_dim=4.*at least head_dim=16"),
      (dict(q_lora_rank=0), "q_lora_rank=0.*indexer reads the query"),
      (dict(index_topk=0), "index_num_heads=8.*only index_topk > 0"),
      (dict(index_stage="dense"), r"index_stage='dense'.*one of \('sparse'"),
      (dict(index_topk=0, index_num_heads=0, index_head_dim=0,
            index_stage="warmup"), "index_stage='warmup'.*indexer to train"))
  def test_bad_indexer_sizes_are_refused(self, changes, message):
    model = deepseek3_2_config.get_config().model
    model.update(changes)
    with self.assertRaisesRegex(ValueError, message):
      ModelConfig.from_dict(model)


def _state(stage: str) -> train_state_lib.TrainState:
  """A tiny DeepSeek-V3.2 (top 4 of 24 tokens) at `index_stage=stage`."""
  cfg = tiny_configs.tiny_model_config("deepseek3_2", window=4,
                                       index_stage=stage)
  values = deepseek3_2_config.get_config().optimizer.to_dict()
  values.update(learning_rate=1e-2, warmup_steps=0, weight_decay=0.1)
  opt_config = optimizer.OptimizerConfig(**values)
  return train_state_lib.create_train_state(
      cfg, seed=0, tx=optimizer.make_optimizer(opt_config, 100),
      schedule=optimizer.learning_rate_schedule(opt_config, 100),
      z_loss=0.0, mesh=mesh_lib.make_mesh(mesh_lib.MeshConfig(
          ici=mesh_lib.AxisSizes(data=-1))))


def _batch():
  tokens = np.random.default_rng(0).integers(0, 64, size=(2, 25),
                                             dtype=np.int32)
  return {"inputs": jnp.asarray(tokens[:, :-1]),
          "targets": jnp.asarray(tokens[:, 1:]),
          "mask": jnp.ones((2, 24), jnp.int32)}


def _indexer_leaves(params, want: bool):
  return {optimizer.path_names(path): leaf for path, leaf in
          jax.tree_util.tree_leaves_with_path(params)
          if mla.INDEXER_PARAMS.isdisjoint(optimizer.path_names(path))
          is not want}


def _train(state, steps):
  metrics = []
  for _ in range(steps):
    state, step_metrics = train_step_lib.train_step(state, _batch())
    metrics.append(jax.device_get(step_metrics))
  return state, metrics


class IndexerTrainingTest(absltest.TestCase):

  def test_warmup_then_sparse(self):
    """Warm-up: the indexer's KL to dense attention falls while every other
    parameter (and so the language-model loss) stays exactly as it was.
    Sparse: the warmed-up state continues (same state structure), the
    language-model loss falls and the indexer's KL over the selected tokens
    stays well under that of the same run with the indexer frozen."""
    warm = _state("warmup")
    frozen = jax.device_get(_indexer_leaves(warm.params, False))
    indexer = jax.device_get(_indexer_leaves(warm.params, True))
    self.assertLen(indexer, 3 * 5)  # 3 layers: 3 kernels, a norm's 2.
    warm, metrics = _train(warm, 10)
    kl = [m["train/indexer_loss"] for m in metrics]
    print(f"warm-up indexer KL: {kl[0]:.4f} -> {kl[-1]:.4f}")
    self.assertLess(kl[-1], 0.5 * kl[0])
    self.assertEqual({float(m["train/loss"]) for m in metrics},
                     {float(metrics[0]["train/loss"])})
    for name, leaf in jax.device_get(
        _indexer_leaves(warm.params, False)).items():
      np.testing.assert_array_equal(leaf, frozen[name], err_msg=str(name))
    for name, leaf in jax.device_get(
        _indexer_leaves(warm.params, True)).items():
      self.assertFalse(np.array_equal(leaf, indexer[name]), name)

    sparse = _state("sparse")
    self.assertEqual(jax.tree.structure(sparse.checkpoint_tree()),
                     jax.tree.structure(warm.checkpoint_tree()))
    warmed = jax.device_get(warm.checkpoint_tree())
    # The same sparse training with the indexer frozen: its KL drifts as the
    # attention it should track learns.
    finals = []
    for trainable in (None, lambda names: mla.INDEXER_PARAMS.isdisjoint(
        names)):
      _, metrics = _train(sparse.replace_checkpoint_tree(
          jax.tree.map(jnp.asarray, warmed)).replace(trainable=trainable), 10)
      loss = [m["train/loss"] for m in metrics]
      self.assertLess(loss[-1], 0.5 * loss[0])
      finals.append(metrics[-1]["train/indexer_loss"])
    print(f"sparse: loss {loss[0]:.4f} -> {loss[-1]:.4f}; indexer KL after"
          f" 10 steps {finals[0]:.4f} (trained), {finals[1]:.4f} (frozen)")
    self.assertLess(finals[0], 0.75 * finals[1])

  def test_language_model_loss_does_not_reach_the_indexer(self):
    state = _state("sparse")
    batch = _batch()

    def cross_entropy(params):
      logits = state.replace(params=params).model()(batch["inputs"])
      return train_step_lib.cross_entropy(logits, batch["targets"],
                                          batch["mask"])[0]

    grads = jax.grad(cross_entropy)(state.params)
    for name, grad in _indexer_leaves(grads, True).items():
      self.assertEqual(float(jnp.abs(grad).max()), 0.0, name)
    self.assertGreater(max(float(jnp.abs(g).max()) for g in
                           _indexer_leaves(grads, False).values()), 0.0)


if __name__ == "__main__":
  absltest.main()
