"""Online distillation of a teacher checkpoint into a student checkpoint.

Both models come from converted (or training) checkpoints of any family and
size whose tokenizers match; the teacher is frozen (optionally int8/nf4).
loss = alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(labels)
       + beta * feature loss (cosine or L2) on chosen (student, teacher)
layer pairs, on the tokens the chat template marks (assistant turns), with
schedules for alpha and beta.

  tools/bazel run //maxtext/bin:distill -- --config=configs/distill.py \
      --load=ckpts/student --teacher=ckpts/teacher --workdir=runs/distill \
      --config.data.files=data/chat.jsonl \
      --config.data.tokenizer=ckpts/student/tokenizer.json

The trained student is written to <workdir>/export like an SFT run.
"""

import ml_collections

from configs import sft


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the distillation config (`arg` must be None)."""
  if arg:
    raise ValueError(f"configs/distill.py has no variants; got {arg!r}.")
  config = sft.posttrain_config("distill")
  config.optimizer.learning_rate = 1e-4
  config.sft = sft.sft_defaults()
  config.distill = ml_collections.ConfigDict(dict(
      # The teacher's checkpoint; the binary's --teacher flag sets it.
      teacher="",
      temperature=2.0,
      # Weight of the distillation term: alpha at update 0, alpha_end at the
      # last, following alpha_schedule ("constant", "linear", "cosine").
      alpha=0.5,
      alpha_end=0.5,
      alpha_schedule="constant",
      # Weight of the feature loss, likewise.
      beta=0.0,
      beta_end=0.0,
      beta_schedule="constant",
      # (student layer, teacher layer) pairs whose block outputs are
      # compared (same width), e.g. ((1, 3), (3, 7)).
      feature_layers=(),
      # "cosine" (1 - cosine similarity) or "l2" (mean squared difference).
      feature_loss="cosine",
      # Quantize the frozen teacher: "", "int8" or "nf4".
      teacher_qtype="",
  ))
  return config
