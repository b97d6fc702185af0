"""A consumer's binary: its own tiny Llama-shaped model from maxtext's
registry, trained by maxtext's train step on random tokens.

  bazel run //:train_step -- --steps=3

Prints the loss of each update; fails unless the loss went down.
"""

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.models import registry
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import train_state
from maxtext.trainers import train_step

_STEPS = flags.DEFINE_integer("steps", 3, "Updates to run.")

# This workspace's own model: a Llama 3 family model, 2 layers of width 32.
_MODEL = dict(family="llama3", vocab_size=128, num_layers=2, embed_dim=32,
              mlp_dim=64, num_heads=4, num_kv_heads=2, head_dim=8)
_OPTIMIZER = dict(learning_rate=1e-2, warmup_steps=0, decay_steps=-1,
                  end_learning_rate_ratio=1.0, b1=0.9, b2=0.95, eps=1e-8,
                  weight_decay=0.0, grad_clip_norm=1.0, z_loss=0.0)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cfg = ModelConfig.from_dict(_MODEL)
  params = nnx.state(registry.abstract_model(cfg), nnx.Param)
  print(f"A {cfg.family} model from maxtext's registry:"
        f" {sum(p.size for p in jax.tree.leaves(params)):,} parameters.")
  opt = optimizer.OptimizerConfig(**_OPTIMIZER)
  state = train_state.create_train_state(
      cfg, seed=0, tx=optimizer.make_optimizer(opt, _STEPS.value),
      schedule=optimizer.learning_rate_schedule(opt, _STEPS.value),
      z_loss=opt.z_loss,
      mesh=mesh_lib.make_mesh(mesh_lib.MeshConfig()))
  # One batch of random tokens, learnt over the updates.
  tokens = np.random.default_rng(0).integers(0, 128, size=(4, 17))
  batch = {"inputs": jnp.asarray(tokens[:, :-1]),
           "targets": jnp.asarray(tokens[:, 1:]),
           "mask": jnp.ones((4, 16), jnp.int32)}
  losses = []
  for step in range(1, _STEPS.value + 1):
    state, metrics = train_step.train_step(state, batch)
    losses.append(float(metrics["train/loss"]))
    print(f"step {step}: loss {losses[-1]:.4f}")
  if len(losses) > 1 and not losses[-1] < losses[0]:
    raise SystemExit(f"The loss did not go down: {losses}.")


if __name__ == "__main__":
  app.run(main)
