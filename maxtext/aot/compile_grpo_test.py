"""Tests of maxtext.aot.compile_grpo: the GRPO policy update compiled ahead
of time is the actor step of Tunix's GRPO learner.

On cpu:8 (data 2 x fsdp 4) the compiled step, run on the real policy and
optimizer of a tiny checkpoint and on a batch the learner itself sampled
and scored (`GRPOLearner._generate_and_compute_advantage`), gives the same
loss, aux metrics, gradient norm and updated parameters as the actor
trainer's jitted step (GRPO with the KL to a reference; GSPO-token with two
iterations, so old-policy log-probs, and LoRA); a v5e:2x2 TPU slice
compiles the toy config (a model from scratch) on this CPU host.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8).
"""

import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.sft import sharding_utils

from configs import grpo as grpo_config
from maxtext.aot import compile_grpo
from maxtext.aot import compile_step
from maxtext.aot import compile_tunix
from maxtext.aot import topology
from maxtext.checkpoint import params_checkpoint
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.models import registry
from maxtext.posttrain import runtime as runtime_lib
from maxtext.rl import grpo
from maxtext.rl import policy as policy_lib
from maxtext.rl import toy_task
from maxtext.rl.config import RlRunConfig
from testing import devices


class CompileGrpoTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.tokenizer, cls.records = toy_task.write_task(
        os.path.join(cls.folder, "toy"))
    # The toy model, saved as the starting checkpoint.
    cfg = RlRunConfig.from_config_dict(grpo_config.get_config()).model
    cls.load = os.path.join(cls.folder, "ckpt")
    params_checkpoint.save_converted(
        cls.load, cfg, params_checkpoint.model_params(
            registry.create_model(cfg, rngs=nnx.Rngs(0))))

  def _config(self, variant: str, **lora) -> RlRunConfig:
    config = grpo_config.get_config(variant)
    config.data.update(source="jsonl", files=self.records,
                       tokenizer=self.tokenizer)
    config.train.load = self.load
    config.optimizer.learning_rate = 1e-2
    # The learner scores at the sampling temperature.
    config.rollout.temperature = 0.7
    config.lora.update(lora)
    config.logging.tensorboard = False
    config.mesh.ici.update(data=2, fsdp=-1)
    return RlRunConfig.from_config_dict(config)

  @parameterized.parameters(dict(variant="toy"),
                            dict(variant="gspo", mode="lora", rank=4))
  def test_cpu_step_equals_tunix_jitted_step(self, variant, **lora):
    devices.require_devices(8)
    config = self._config(variant, **lora)
    hardware = topology.hardware_for("cpu:8")
    compiled = compile_grpo.compile_grpo_step(config, hardware)

    runtime = runtime_lib.make_runtime(config)
    learner, _ = grpo.make_learner(
        config, tempfile.mkdtemp(dir=self.folder), load=config.train.load,
        runtime=runtime, rollout_mesh=runtime.mesh,
        tokenizer=policy_lib.RlTokenizer(
            tokenizer_lib.load_tokenizer(config.data.tokenizer)))
    trainer = learner.rl_cluster.actor_trainer
    problems = toy_task.problems()[:config.train.rows]
    generations = config.rl.num_generations
    # What `learner.train` sets before its first batch (no micro-batches).
    learner._rollout_micro_batch_size = config.train.rows  # pylint: disable=protected-access
    learner._compute_logps_micro_batch_size = config.train.rows  # pylint: disable=protected-access
    with runtime.activate():
      # The learner's own batch: rollouts, rewards, advantages, reference
      # (and old-policy) log-probs.
      example = learner._generate_and_compute_advantage({  # pylint: disable=protected-access
          key: [p[field] for p in problems for _ in range(generations)]
          for key, field in (("prompts", "prompt"), ("answer", "answer"))})
      self.assertEqual(example.ref_per_token_logps is None,
                       not config.rl.beta)
      self.assertEqual(example.old_per_token_logps is None,
                       config.rl.num_iterations == 1)
      example = sharding_utils.shard_input(example,
                                           trainer.config.data_sharding_axis)
      # A copy: each step updates its pair in place and donates its
      # optimizer (the model included).
      model, optimizer = compiled.merge(jax.tree.map(
          jnp.copy, nnx.state((trainer.model, trainer.optimizer))))
      jitted, _ = trainer.jit_train_and_eval_step()
      want_loss, want_aux, want_norm = jitted(example)
      got_loss, got_aux, got_norm = compiled.nnx_compiled(
          model, optimizer, compiled.put(example))
    self.assertEqual(float(got_loss), float(want_loss))
    self.assertEqual(float(got_norm), float(want_norm))
    self.assertGreater(float(want_norm), 0.0)
    jax.tree.map(np.testing.assert_array_equal, got_aux, want_aux)
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                 nnx.to_pure_dict(nnx.state(trainer.model, nnx.Param)))

  def test_tpu_slice_compiles_the_toy_config_on_this_host(self):
    config = grpo_config.get_config()
    config.mesh.ici.update(data=1, fsdp=-1)
    compiled = compile_grpo.compile_grpo_step(
        RlRunConfig.from_config_dict(config),
        topology.hardware_for("v5e:2x2"))
    report = compile_tunix.analyse(compiled)
    self.assertTrue(report.fits)
    self.assertGreater(report.xla_flops, 0)
    self.assertIn("all-gather", report.collectives)
    # 8 prompts x 8 generations of 8 + 4 tokens.
    self.assertEqual((compiled.rows, compiled.seq_len), (64, 12))
    self.assertIn("v5e HBM", compile_step.format_report(report,
                                                        compiled.step))

  def test_rollout_devices_leave_the_trainer_its_share(self):
    config = grpo_config.get_config()
    config.rollout.devices = 2
    config.mesh.ici.update(data=1, fsdp=-1)
    compiled = compile_grpo.compile_grpo_step(
        RlRunConfig.from_config_dict(config),
        topology.hardware_for("v5e:2x2"))
    self.assertEqual(dict(compiled.step.mesh.shape)["fsdp"], 2)
    config.rollout.devices = 4
    with self.assertRaisesRegex(ValueError, r"rollout.devices=4 leaves no"
                                r" trainer device of the 4 \(TPU v5"):
      compile_grpo.compile_grpo_step(
          RlRunConfig.from_config_dict(config),
          topology.hardware_for("v5e:2x2"))


if __name__ == "__main__":
  absltest.main()
