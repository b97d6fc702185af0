"""Real sizes of the newer families compile for TPU topologies and fit.

Manual (`tools/bazel test //maxtext/bin:aot_real_sizes_test`): each case runs
`aot_compile` on a published size, minutes of XLA compile per case on a CPU
host, too long for `bazel test //...`. The memory table of each case is in
the test log; the same commands are in `docs/aot_compile.md`.

Needs libtpu (a dependency; no TPU).
"""

import json
import os
import subprocess

from absl.testing import absltest
from absl.testing import parameterized

from configs import gemma3 as gemma3_config
from configs import llama4 as llama4_config
from maxtext.checkpoint import params_checkpoint
from maxtext.common.model_config import ModelConfig
from testing import train_process

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_TIMEOUT_S = 1800

# (config, topology, overrides): one published size per family, FSDP over
# the slice, full remat unless said, batch and length of a pre-training step.
_FULL = "--config.remat.policy=full"
CASES = (
    ("olmo3.py:7b", "v5p-8", (_FULL, "--config.train.batch_size=8",
                              "--config.data.seq_len=4096")),
    ("deepseek2.py:lite", "v5p-8", (_FULL, "--config.train.batch_size=8",
                                    "--config.data.seq_len=4096")),
    # 108B parameters in bfloat16 with float32 Adam moments over 32 chips
    # (float32 weights need 99.81 GiB per chip, 104% of HBM; v5p-128 also
    # compiles since the layer-scan fix, docs/aot_compile.md); one row of a
    # whole chunk per chip.
    ("llama4.py:scout", "v5p-64", (_FULL, "--config.train.batch_size=32",
                                   "--config.data.seq_len=8192",
                                   "--config.model.param_dtype=bfloat16")),
    # Gated DeltaNet and gated full attention, 256 experts (34.66B).
    ("qwen3_5_moe.py:35b-a3b", "v5p-32", (_FULL, "--config.train.batch_size=16",
                                          "--config.data.seq_len=4096")),
    # DeepSeek-V3.2-Exp's sizes (each query attends to its indexer's top
    # 2048 of 4096 tokens) at 4 of its 61 layers (3 dense, 1 with 256
    # experts) and its prediction depth, the indexer's loss trained; one row
    # per chip (v5p-32 needs 106.9% of HBM, docs/aot_compile.md).
    ("deepseek3_2.py:671b", "v5p-64", (_FULL, "--config.train.batch_size=32",
                                       "--config.data.seq_len=4096",
                                       "--config.model.num_layers=4")),
    ("gemma4.py:31b", "v5p-32", (_FULL, "--config.train.batch_size=16",
                                 "--config.data.seq_len=4096")),
    # As measured in docs/aot_compile.md (keeping the q/k/v projections).
    ("gemma4.py:26b-a4b", "v5p-32", ("--config.remat.policy=save_qkv_proj",
                                     "--config.train.batch_size=16",
                                     "--config.data.seq_len=4096")),
)


class AotRealSizesTest(parameterized.TestCase):

  def _compile(self, config, topology, overrides, step="Train step"):
    env = train_process.child_env(1)
    env.pop("JAX_NUM_CPU_DEVICES")  # The binary makes the target's devices.
    argv = train_process.module_argv("maxtext.bin.aot_compile") + [
        f"--config={os.path.join(_ROOT, 'configs', config)}",
        f"--topology={topology}", "--config.mesh.ici.data=1",
        "--config.mesh.ici.fsdp=-1", *overrides]
    result = subprocess.run(argv, env=env, cwd=_ROOT, capture_output=True,
                            text=True, timeout=_TIMEOUT_S, check=False)
    print(f"== {config} on {topology}\n{result.stdout}")
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn(f"{step} on {topology}:", result.stdout)
    self.assertRegex(result.stdout, r"fits: \d+\.\d% of v5p HBM\.")

  @parameterized.parameters(*CASES)
  def test_compiles_and_fits(self, config, topology, overrides):
    self._compile(config, topology,
                  ("--config.data.source=synthetic", *overrides))

  def _model_config_folder(self, config_module, variant) -> str:
    """A folder holding only a checkpoint's model config (all compiling
    reads)."""
    load = self.create_tempdir().full_path
    with open(os.path.join(load, params_checkpoint.MODEL_CONFIG_FILENAME),
              "w", encoding="utf-8") as f:
      json.dump(ModelConfig.from_dict(
          config_module.get_config(variant).model).to_dict(), f)
    return load

  def test_gemma3_4b_with_its_tower_sft_step(self):
    """Gemma 3 4B with its SigLIP tower (frozen): the sft step on 8 rows of
    512 tokens and one 896 x 896 image each, full remat, v5p-8."""
    load = self._model_config_folder(gemma3_config, "4b_vlm")
    self._compile("sft_vlm.py:gemma3", "v5p-8", (
        f"--config.train.load={load}", "--config.data.files=unread.jsonl",
        _FULL), step="Sft step (Tunix PeftTrainer)")

  def test_llama4_scout_with_its_tower_sft_step(self):
    """Llama 4 Scout (108.64B) with its tower (frozen), LoRA: the sft step
    on 32 rows of 4096 tokens with 17 tiles of 336 x 336 each (an image's
    16 tiles and its global view), full remat, v5p-64 (measured: 33.83 GiB
    per chip, docs/aot_compile.md)."""
    load = self._model_config_folder(llama4_config, "scout_vlm")
    self._compile("sft_vlm.py:llama4_lora", "v5p-64", (
        f"--config.train.load={load}", "--config.data.files=unread.jsonl",
        "--config.data.chat_template=llama3", "--config.train.batch_size=32",
        _FULL), step="Sft step (Tunix PeftTrainer)")


if __name__ == "__main__":
  absltest.main()
