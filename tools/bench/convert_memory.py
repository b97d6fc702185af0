"""Peak memory (RSS) of checkpoint conversion vs. the model's size.

Writes a random Llama-shaped Hugging Face folder (642 MB of float32), or
takes a real one (`--hf_dir`, e.g. SmolLM2 saved by transformers), then runs
each conversion direction in a fresh process and prints its peak RSS minus
that of a process that only imports the same modules.

  tools/bazel run //tools/bench:convert_memory -- [--hf_dir=DIR] [workdir]
"""

import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from tools.bench import memory

_HF_DIR = flags.DEFINE_string(
    "hf_dir", None, "A Hugging Face checkpoint folder to convert instead of a"
    " random Llama-shaped one.")

_IMPORTS = "from maxtext.checkpoint import hf_convert; import jax; jax.devices()"


def _write_random_model(hf_dir: str) -> None:
  setup = f"""
import json, numpy as np
from maxtext.checkpoint import hf_convert, safetensors_io
from maxtext.common.model_config import ModelConfig
cfg = ModelConfig.from_dict(dict(family="llama3", vocab_size=32000,
                                 num_layers=8, embed_dim=1024, mlp_dim=2816,
                                 num_heads=8, num_kv_heads=8, head_dim=128,
                                 tie_embeddings=False))
hf = hf_convert.hf_config_dict(cfg)
rng = np.random.default_rng(0)
def tensors():
  from maxtext.models import hf_weights, registry
  abstract = registry.abstract_model(cfg)
  for entry, variable, layer in hf_weights._entries(abstract):
    for i in range(cfg.num_layers if "{{layer}}" in entry.hf_name else 1):
      name = entry.hf_name.format(layer=i)
      shape = entry.hf_shape(variable.shape[1:] if "{{layer}}" in entry.hf_name
                             else variable.shape)
      yield name, np.full(shape, 0.01, np.float32)
safetensors_io.write_weights({hf_dir!r}, tensors, max_shard_size="200MB")
json.dump(hf, open({hf_dir!r} + "/config.json", "w"))
"""
  subprocess.run([sys.executable, "-c", setup], check=True)


def main(argv: list[str]) -> None:
  if len(argv) > 2:
    raise app.UsageError(f"Unexpected arguments: {argv[2:]}")
  work = argv[1] if len(argv) > 1 else tempfile.mkdtemp()
  hf_dir = _HF_DIR.value
  if not hf_dir:
    hf_dir = os.path.join(work, "hf")
    _write_random_model(hf_dir)
  size_mb = sum(os.path.getsize(os.path.join(hf_dir, f))
                for f in os.listdir(hf_dir)
                if f.endswith(".safetensors")) / 2**20
  base = memory.peak_rss_mb(_IMPORTS)
  ours = os.path.join(work, "ours")
  to_ours = memory.peak_rss_mb(
      _IMPORTS + f"\nhf_convert.hf_to_orbax({hf_dir!r}, {ours!r})")
  to_hf = memory.peak_rss_mb(
      _IMPORTS + f"\nhf_convert.orbax_to_hf({ours!r}, {work + '/back'!r},"
      " max_shard_size='200MB')")
  print(json.dumps({
      "hf_dir": hf_dir,
      "safetensors_mb": round(size_mb),
      "imports_only_peak_rss_mb": round(base),
      "hf_to_orbax_peak_rss_over_imports_mb": round(to_ours - base),
      "orbax_to_hf_peak_rss_over_imports_mb": round(to_hf - base),
  }))

if __name__ == "__main__":
  app.run(main)
