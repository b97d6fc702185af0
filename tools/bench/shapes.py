"""Issue #14's standard training shapes as experiments.

Each shape is a Llama decoder (MaxText's default decoder) trained on random
tokens (data.source "synthetic"), with data parallelism over all devices or,
with `fsdp`, parameters and batch split over all devices (MaxText's default
mesh):

  tiny   emb 256, 4 heads of 64, 4 kv heads, MLP 1024, 2 layers, vocab
         32000, seq 256, global batch 8 (18.5M parameters)
  small  emb 768, 12 heads of 64, 12 kv heads, MLP 3072, 6 layers, vocab
         32000, seq 512, global batch `small_batch` (about 106M)
  llama3-8b  Llama 3 8B's widths (emb 4096, 32 heads of 128, 8 kv heads,
         MLP 14336, vocab 128256, seq 8192) at reduced depth, 4 of its 32
         layers (1.9B parameters), global batch `small_batch`: for a GPU
         (`gpu_h200.sh`), too large to train on these CPUs
"""

from configs import llama3
from maxtext.trainers import config as config_lib

# The model and data fields each shape sets (`seq_len` goes to data).
SHAPES = {
    "tiny": dict(embed_dim=256, num_heads=4, num_kv_heads=4, head_dim=64,
                 mlp_dim=1024, num_layers=2, vocab_size=32_000, seq_len=256),
    "small": dict(embed_dim=768, num_heads=12, num_kv_heads=12, head_dim=64,
                  mlp_dim=3072, num_layers=6, vocab_size=32_000, seq_len=512),
    "llama3-8b": dict(embed_dim=4096, num_heads=32, num_kv_heads=8,
                      head_dim=128, mlp_dim=14336, num_layers=4,
                      vocab_size=128_256, seq_len=8192),
}


def global_batch(shape: str, small_batch: int) -> int:
  """Global batch of `shape`: 8 for `tiny`, else `small_batch`."""
  return 8 if shape == "tiny" else small_batch


def experiment_config(shape: str, dtype: str, small_batch: int = 8, *,
                      fsdp: bool = False, attention_impl: str = "auto",
                      attention_block: int = 512
                      ) -> config_lib.ExperimentConfig:
  """The experiment of standard shape `shape` in `dtype` (FSDP with `fsdp`),
  attention by `attention_impl` (`maxtext.kernels.dispatch.IMPLS`) with
  query and key tiles of `attention_block`.

  Raises:
    ValueError: an unknown shape (names the valid ones).
  """
  if shape not in SHAPES:
    raise ValueError(f"Unknown shape {shape!r}; valid: {sorted(SHAPES)}.")
  fields = dict(SHAPES[shape])
  config = llama3.get_config()
  config.data.seq_len = fields.pop("seq_len")
  config.model.update(dict(fields, tie_embeddings=False, dtype=dtype))
  config.data.source = "synthetic"
  config.train.batch_size = global_batch(shape, small_batch)
  config.attention_kernel.update(dict(impl=attention_impl,
                                      block_q=attention_block,
                                      block_kv=attention_block))
  if fsdp:
    config.mesh.ici.data = 1
    config.mesh.ici.fsdp = -1
  return config_lib.ExperimentConfig.from_config_dict(config)
