"""The real pretraining run compiles its train step once and nothing after.

Counts XLA compilations (`jax.monitoring` backend-compile events, by function
name) during `pretrain.train` of a tiny Gemma 3 with periodic checkpoints and
evaluations: the train step compiles exactly once, and once every periodic
action has happened once (the first evaluation compiles the eval step), the
remaining updates, evaluations and checkpoints compile nothing.
"""

import os
from typing import Any

from absl.testing import absltest
import jax
from jax import monitoring

from configs import gemma3
from maxtext.trainers import loop
from maxtext.trainers import pretrain

_TEXT = "Now is the winter of our discontent\nMade glorious summer.\n" * 8
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"

# Names of the functions compiled since the listener was registered.
_COMPILED: list[str] = []


def _record(event: str, duration_s: float, **kwargs) -> None:
  del duration_s
  if event == _BACKEND_COMPILE:
    _COMPILED.append(kwargs.get("fun_name", "?"))


monitoring.register_event_duration_secs_listener(_record)


class _CompileLog(loop.Hook):
  """Records the compilations seen by the end of each update."""

  def __init__(self):
    self.by_step: dict[int, int] = {}
    self.at_end = 0

  def after_step(self, step: int, state: Any) -> None:
    self.by_step[step] = len(_COMPILED)

  def on_end(self, step: int, state: Any) -> None:
    self.at_end = len(_COMPILED)


class CompileCountTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    # A persistent-cache hit would skip the compile event being counted.
    jax.config.update("jax_enable_compilation_cache", False)

  def test_train_step_compiles_once_and_nothing_compiles_later(self):
    text_file = self.create_tempfile("text.txt", content=_TEXT).full_path
    config = gemma3.get_config()
    config.model.update(dict(num_layers=2, embed_dim=32, mlp_dim=64,
                             num_heads=2, num_kv_heads=1, head_dim=16,
                             query_pre_attn_scalar=16.0, sliding_window=8,
                             global_layer_interval=2))
    config.data.files = text_file
    config.data.eval_files = text_file
    config.data.eval_every_steps = 2
    config.data.eval_steps = 1
    config.data.seq_len = 16
    config.train.steps = 8
    config.train.batch_size = 4
    config.checkpoint.every_steps = 3
    config.logging.every_steps = 1
    compile_log = _CompileLog()
    start = len(_COMPILED)
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    result = pretrain.train(config, workdir, hooks=[compile_log])

    self.assertEqual(result.step, 8)
    compiled = _COMPILED[start:]
    self.assertEqual([name for name in compiled if "train_step" in name],
                     ["jit(train_step)"])
    # Updates 5..8 include evaluations (6, 8), a checkpoint (6) and the
    # final save: all were done once before update 4 ended.
    late = _COMPILED[compile_log.by_step[4]:]
    self.assertEqual(late, [], f"compiled after update 4: {late}")
    self.assertEqual(compile_log.at_end, compile_log.by_step[4])


if __name__ == "__main__":
  absltest.main()
