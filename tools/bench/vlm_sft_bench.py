r"""Speed of a multimodal SFT step: images/s, tokens/s and the tower's share.

  tools/bazel run //tools/bench:vlm_sft_bench -- \
      [--config=configs/gemma3.py:small] [--vision_layers=4] [--steps=5]

Builds the config's Gemma 3 text model with a SigLIP tower (sizes from the
flags; a config variant that has one, e.g. 4b_vlm, keeps its own), and
times, side by side in one run on this machine:
  * the SFT train step sft runs (`maxtext.posttrain.sft`: masked
    cross-entropy through `TunixModel`, gradients, AdamW with the tower
    frozen or trained), on rows of --seq_len tokens holding one image each;
  * the tower and projector alone (forward, `Decoder.image_embeddings`) on
    the same images;
  * the text model's step alone on the same tokens without images.
It prints step times, images/s, tokens/s, the tower's share of the step
(measured and by our FLOP count, `maxtext.metrics.flops`), with the tower
frozen (default) and trained. Figures, not asserts; tools/bench/README.md
keeps a table.
"""

import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.common import config_flag
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.posttrain import sft

_CONFIG = config_flag.define_config_file(
    "config", "A Gemma 3 config and variant, e.g. configs/gemma3.py:small.")
_VISION_LAYERS = flags.DEFINE_integer("vision_layers", 4, "Tower layers.")
_VISION_WIDTH = flags.DEFINE_integer("vision_width", 192, "Tower width.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Image side.")
_TOKENS_PER_IMAGE = flags.DEFINE_integer("tokens_per_image", 64,
                                         "Soft tokens per image.")
_BATCH = flags.DEFINE_integer("batch", 4, "Rows per step (one image each).")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "Tokens per row.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps (after 1 warm-up).")


def _model_config() -> ModelConfig:
  values = dict(_CONFIG.value.model)
  if not values.get("vision_layers"):
    width = _VISION_WIDTH.value
    values.update(vision_layers=_VISION_LAYERS.value, vision_embed_dim=width,
                  vision_mlp_dim=4 * width, vision_heads=max(1, width // 64),
                  vision_patch_size=14, vision_image_size=_IMAGE_SIZE.value,
                  mm_tokens_per_image=_TOKENS_PER_IMAGE.value,
                  image_token_id=values["vocab_size"] - 1,
                  image_start_id=values["vocab_size"] - 3,
                  image_end_id=values["vocab_size"] - 2)
  return ModelConfig.from_dict(values).replace(scan_layers=False)


def _batch(cfg: ModelConfig, rng) -> dict[str, jax.Array]:
  rows, length = _BATCH.value, _SEQ_LEN.value
  vision = cfg.vision
  inputs = rng.integers(0, vision.image_start_id, (rows, length))
  inputs[:, 1] = vision.image_start_id
  inputs[:, 2:2 + vision.tokens_per_image] = vision.image_token_id
  inputs[:, 2 + vision.tokens_per_image] = vision.image_end_id
  side = vision.image_size
  return dict(
      inputs=jnp.asarray(inputs, jnp.int32),
      targets=jnp.asarray(np.roll(inputs, -1, axis=1), jnp.int32),
      mask=jnp.ones((rows, length), jnp.int32),
      images=jnp.asarray(rng.uniform(-1, 1, (rows, 1, side, side, 3)),
                         jnp.float32))


def _time(fn, *args) -> float:
  """Seconds per call of `fn(*args)` (jitted), after one warm-up."""
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(_STEPS.value):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / _STEPS.value


def _step_time(cfg: ModelConfig, batch, *, frozen: bool,
               images: bool) -> float:
  model = adapter.TunixModel(registry.create_model(cfg, rngs=nnx.Rngs(0)))
  tx = optax.adamw(1e-4)
  optimizer = nnx.Optimizer(model, sft.frozen_vision(tx) if frozen else tx,
                            wrt=nnx.Param)
  shown = batch if images else {k: v for k, v in batch.items()
                                if k != "images"}

  @nnx.jit
  def step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(sft.sft_loss)(model, **batch)
    optimizer.update(model, grads)
    return loss

  return _time(step, model, optimizer, shown)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cfg = _model_config()
  batch = _batch(cfg, np.random.default_rng(0))
  rows, length = _BATCH.value, _SEQ_LEN.value
  model = registry.create_model(cfg, rngs=nnx.Rngs(0))
  tower = _time(nnx.jit(lambda m, i: m.image_embeddings(i)), model,
                batch["images"])
  text = _step_time(cfg, batch, frozen=True, images=False)
  print(f"{cfg.family}: {cfg.num_layers} layers x {cfg.embed_dim}, tower "
        f"{cfg.vision.layers} layers x {cfg.vision.embed_dim} on "
        f"{cfg.vision.image_size}px images ({cfg.vision.patches_per_side**2}"
        f" patches, {cfg.vision.tokens_per_image} soft tokens); {rows} rows "
        f"x {length} tokens, one image each; {jax.devices()[0].platform}")
  print(f"{'step':<28}{'s/step':>9}{'images/s':>10}{'tokens/s':>10}"
        f"{'tower share':>13}{'by FLOPs':>10}")
  print(f"{'text only (no images)':<28}{text:>9.3f}{'-':>10}"
        f"{rows * length / text:>10.0f}{'-':>13}{'-':>10}")
  text_flops = flops.training_flops_per_token(cfg, length) * rows * length
  frozen = _step_time(cfg, batch, frozen=True, images=True)
  trained = _step_time(cfg, batch, frozen=False, images=True)
  # Frozen: the tower's forward; trained: that plus what training it adds
  # to the frozen step.
  for name, step, tower_s, trains in (
      ("with images, tower frozen", frozen, tower, False),
      ("with images, tower trained", trained, tower + trained - frozen,
       True)):
    image_flops = rows * flops.vision_flops_per_image(cfg, trained=trains)
    measured = tower_s / step
    print(f"{name:<28}{step:>9.3f}{rows / step:>10.1f}"
          f"{rows * length / step:>10.0f}{measured:>12.0%} "
          f"{image_flops / (image_flops + text_flops):>9.0%}")
  print(f"{'tower forward alone':<28}{tower:>9.3f}{rows / tower:>10.1f}")


if __name__ == "__main__":
  app.run(main)
