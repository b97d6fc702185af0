"""Preference tuning with DPO or ORPO, run by //maxtext/bin:sft.

Records hold a prompt (a string, or a list of chat messages), a chosen and a
rejected response (dpo.prompt_field, dpo.chosen_field, dpo.rejected_field),
in JSONL, Parquet, ArrayRecord or Arrow files. The prompt is rendered by
data.chat_template with the generation prompt; each response is scored as
the assistant's reply (with the template's end-of-turn markup).

  tools/bazel run //maxtext/bin:sft -- --config=configs/dpo.py \
      --load=runs/sft_try/export --workdir=runs/dpo_try \
      --config.data.files=data/preferences.jsonl \
      --config.data.tokenizer=runs/sft_try/export/tokenizer.json

Variants: dpo (default; the reference is the frozen starting model, or none
with --config.dpo.reference=none) and orpo (no reference model; SFT loss
plus lambda_orpo times the odds-ratio loss). LoRA works as in configs/sft.py
(--config.lora.mode=lora).
"""

import ml_collections

from configs import sft

VARIANTS = ("dpo", "orpo")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the preference-tuning config of variant `arg` (None: "dpo")."""
  variant = arg or "dpo"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown dpo variant {variant!r}; valid variants:"
                     f" {sorted(VARIANTS)}.")
  config = sft.posttrain_config(variant)
  config.optimizer.learning_rate = 5e-6
  config.dpo = ml_collections.ConfigDict(dict(
      # DPO: implicit reward beta * log(pi / pi_ref).
      beta=0.1,
      # Probability that a preference is flipped (robust DPO / ORPO).
      label_smoothing=0.0,
      # ORPO: weight of the odds-ratio loss added to the SFT loss.
      lambda_orpo=0.1,
      # DPO: "initial" (the frozen starting model) or "none".
      reference="initial",
      prompt_field="prompt",
      chosen_field="chosen",
      rejected_field="rejected",
      # Tokens kept: the prompt's last ones (left-padded), the responses'
      # first ones (right-padded).
      max_prompt_length=128,
      max_response_length=128,
  ))
  return config
