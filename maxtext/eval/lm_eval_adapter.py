"""An lm-eval (`lm_eval`, EleutherAI's harness) model backed by our decoder.

`MaxTextLM` answers the harness's three request kinds:
  * `loglikelihood`: (context, continuation) texts are tokenized as the
    harness's Hugging Face model does (trailing spaces of the context move to
    the continuation; the continuation's tokens are those of the whole text
    after the context's), then scored in batches, one forward pass per batch
    (`maxtext.eval.scoring`);
  * `loglikelihood_rolling`: a whole text, in rolling windows of `max_length`
    tokens, the first conditioned on BOS (EOS when there is no BOS);
  * `generate_until`: greedy or sampled generation with a KV cache
    (`maxtext.inference.generate`), batched by identical generation settings,
    cut at the first stop string; EOS ends a row.

It is registered as "maxtext", so `lm_eval.simple_evaluate(model="maxtext",
model_args="checkpoint=...")` works once this module is imported; the eval
binary (`//maxtext/bin:eval`) passes an instance instead.
"""

import json
from typing import Any

from flax import nnx
from lm_eval import utils as lm_eval_utils
from lm_eval.api import model as lm_model
from lm_eval.api import registry
from lm_eval.models import utils as lm_utils

from maxtext.checkpoint import params_checkpoint
from maxtext.data import assets
from maxtext.data import chat_template as chat_lib
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.eval import scoring
from maxtext.inference import generate
from maxtext.inference import sampler

DEFAULT_MAX_LENGTH = 2048
DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_GEN_TOKS = 256
# Names of the tokenizer files a converted checkpoint carries, preferred first.
# Generation settings `generate_until` understands (after lm-eval's
# normalisation); anything else in a task's generation_kwargs is refused.
_GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k",
               "top_p")


def checkpoint_tokenizer_path(checkpoint: str) -> str:
  """The tokenizer file that belongs to `checkpoint`
  (`params_checkpoint.tokenizer_path`), else the bundled Mistral one."""
  return (params_checkpoint.tokenizer_path(checkpoint)
          or assets.default_tokenizer())


@registry.register_model("maxtext")
class MaxTextLM(lm_model.TemplateLM):
  """lm-eval's model interface over a decoder and our tokenizer.

  Attributes:
    model: The decoder.
    text_tokenizer: Our tokenizer (`maxtext.data.tokenizer.Tokenizer`).
    max_length: Most tokens the model sees at once (context + continuation,
      or prompt + generated tokens).
    batch_size: Requests per forward pass or generation batch.
    max_gen_toks: Generated tokens per request unless the task sets
      `max_gen_toks`.
    add_bos: Start every encoded context with BOS (Gemma needs it).
    seed: Seed of sampled generation.
    scorer: Scores token requests (`maxtext.eval.scoring.Scorer`).
    chat: Renders conversations (lm-eval's `apply_chat_template`: a task's
      turns, few-shot examples as earlier turns) with the chat template;
      None without one.
  """

  def __init__(self, model: nnx.Module, tokenizer: tokenizer_lib.Tokenizer, *,
               max_length: int = DEFAULT_MAX_LENGTH,
               batch_size: int = DEFAULT_BATCH_SIZE,
               max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
               add_bos: bool = False, seed: int = 0,
               chat_template: str = ""):
    super().__init__()
    if tokenizer.vocab_size > model.cfg.vocab_size:
      raise ValueError(
          f"Tokenizer {tokenizer.path!r} has {tokenizer.vocab_size} ids but"
          f" the model's vocab_size is {model.cfg.vocab_size}; give the"
          " model's own tokenizer (--tokenizer).")
    if add_bos and tokenizer.bos_id is None:
      raise ValueError(f"add_bos=True but tokenizer {tokenizer.path!r} has no"
                       " BOS token.")
    self.model = model
    self.text_tokenizer = tokenizer
    self.max_length = max_length
    self.batch_size = batch_size
    self.max_gen_toks = max_gen_toks
    self.add_bos = add_bos
    self.seed = seed
    self.scorer = scoring.Scorer(model, max_length=max_length,
                                  batch_size=batch_size)
    self.chat = (chat_lib.ChatEncoder(chat_template, tokenizer)
                 if chat_template else None)

  def apply_chat_template(self, chat_history: list[dict[str, str]],
                          add_generation_prompt: bool = True) -> str:
    """The chat template's text of `chat_history` (lm-eval's hook).

    Raises:
      ValueError: the model was made without a chat template.
    """
    if self.chat is None:
      raise ValueError("This evaluation applies a chat template, but none"
                       " was given (--chat_template).")
    return self.chat.render(chat_history,
                            add_generation_prompt=add_generation_prompt)

  def chat_template(self, chat_template: bool | str = False) -> str:
    """The chat template's source (lm-eval fingerprints requests with it)."""
    del chat_template
    return self.chat.source if self.chat is not None else ""

  @classmethod
  def from_checkpoint(cls, checkpoint: str, *, tokenizer: str | None = None,
                      **kwargs) -> "MaxTextLM":
    """Loads a converted checkpoint, training checkpoint or workdir.

    Args:
      checkpoint: Its path (see `params_checkpoint.load_params`).
      tokenizer: A tokenizer file; default: `checkpoint_tokenizer_path`.
      **kwargs: The other constructor arguments.
    """
    cfg, params = params_checkpoint.load_params(checkpoint)
    model = params_checkpoint.model_from_params(cfg, params)
    return cls(model, tokenizer_lib.load_tokenizer(
        tokenizer or checkpoint_tokenizer_path(checkpoint)), **kwargs)

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                          additional_config: dict[str, Any] | None = None
                          ) -> "MaxTextLM":
    """lm-eval's constructor: `checkpoint` (required), `tokenizer` and the
    constructor's keyword arguments; of the harness's `additional_config`,
    `batch_size` is used."""
    args = dict(arg_dict)
    if "checkpoint" not in args:
      raise ValueError("model_args needs checkpoint=<path of a converted "
                       "checkpoint, training checkpoint or workdir>.")
    batch_size = (additional_config or {}).get("batch_size")
    if batch_size is not None:
      args.setdefault("batch_size", batch_size)
    types = dict(max_length=int, batch_size=int, max_gen_toks=int, seed=int,
                 add_bos=lambda v: str(v).lower() in ("1", "true"))
    unknown = set(args) - set(types) - {"checkpoint", "tokenizer"}
    if unknown:
      raise ValueError(f"Unknown model_args {sorted(unknown)}; valid:"
                       f" checkpoint, tokenizer, {', '.join(types)}.")
    for key, convert in types.items():
      if key in args:
        args[key] = convert(args[key])
    return cls.from_checkpoint(args.pop("checkpoint"), **args)

  @classmethod
  def create_from_arg_string(cls, arg_string: str,
                             additional_config: dict[str, Any] | None = None
                             ) -> "MaxTextLM":
    return cls.create_from_arg_obj(
        lm_eval_utils.simple_parse_args_string(arg_string), additional_config)

  @property
  def eot_token_id(self) -> int:
    eos = self.text_tokenizer.eos_id
    if eos is None:
      raise ValueError(f"Tokenizer {self.text_tokenizer.path!r} has no EOS"
                       " token, which this request needs.")
    return eos

  @property
  def prefix_token_id(self) -> int:
    """What an empty context and a rolling text are conditioned on."""
    bos = self.text_tokenizer.bos_id
    return self.eot_token_id if bos is None else bos

  @property
  def tokenizer_name(self) -> str:
    return self.text_tokenizer.path

  def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                 **kwargs) -> list[int]:
    """Token ids of `string`, after BOS with `add_bos` (unless
    `add_special_tokens=False`)."""
    del kwargs
    ids = self.text_tokenizer.encode(string)
    if self.add_bos and add_special_tokens is not False:
      ids = [self.text_tokenizer.bos_id, *ids]
    return ids

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                            **kwargs) -> list[tuple[float, bool]]:
    del disable_tqdm, kwargs
    results = self.scorer.score(
        [(context, continuation) for _, context, continuation in requests])
    for (texts, _, _), result in zip(requests, results):
      if texts is not None:
        self.cache_hook.add_partial("loglikelihood", texts, result)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False
                            ) -> list[float]:
    del disable_tqdm
    texts = [request.args[0] for request in requests]
    results = self.scorer.score_rolling(
        [self.tok_encode(text, add_special_tokens=False) for text in texts],
        prefix_id=self.prefix_token_id)
    for text, result in zip(texts, results):
      self.cache_hook.add_partial("loglikelihood_rolling", (text,), result)
    return results

  def _generation_settings(self, gen_kwargs: dict[str, Any]
                           ) -> tuple[list[str], int, sampler.SamplingParams]:
    """(stop strings, max new tokens, sampling) of one request's settings."""
    kwargs = lm_utils.normalize_gen_kwargs(
        gen_kwargs, default_max_gen_toks=self.max_gen_toks)
    unknown = set(kwargs) - set(_GEN_KWARGS)
    if unknown:
      raise ValueError(f"Unsupported generation_kwargs {sorted(unknown)};"
                       f" supported: {_GEN_KWARGS}.")
    max_new = kwargs["max_gen_toks"]
    if not 0 < max_new < self.max_length:
      raise ValueError(f"max_gen_toks={max_new} must be in [1, max_length="
                       f"{self.max_length}).")
    params = sampler.SamplingParams(
        float(kwargs["temperature"]) if kwargs["do_sample"] else 0.0,
        int(kwargs.get("top_k", 0)), float(kwargs.get("top_p", 1.0)))
    return kwargs["until"], max_new, params.validate()

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    del disable_tqdm
    groups: dict[str, list[int]] = {}
    settings = []
    for index, request in enumerate(requests):
      settings.append(self._generation_settings(request.args[1]))
      key = json.dumps([settings[-1][0], settings[-1][1],
                        repr(settings[-1][2])])
      groups.setdefault(key, []).append(index)
    eos = self.text_tokenizer.eos_id
    outputs = [None] * len(requests)
    for indices in groups.values():
      until, max_new, params = settings[indices[0]]
      stops = lm_utils.handle_stop_sequences(
          until, None if eos is None else self.text_tokenizer.decode([eos]))
      prompts = {index: self._prompt(requests[index].args[0], max_new)
                 for index in indices}
      indices = sorted(indices, key=lambda i: -len(prompts[i]))
      for start in range(0, len(indices), self.batch_size):
        batch = indices[start:start + self.batch_size]
        generated = generate.generate(
            self.model, [prompts[i] for i in batch], max_new_tokens=max_new,
            params=params, eos_id=eos, seed=self.seed + start)
        for index, tokens in zip(batch, generated):
          if tokens and tokens[-1] == eos:
            tokens = tokens[:-1]
          text = lm_utils.postprocess_generated_text(
              self.text_tokenizer.decode(tokens), stops, None)
          outputs[index] = text
          self.cache_hook.add_partial("generate_until", requests[index].args,
                                      text)
    return outputs

  def _prompt(self, context: str, max_new: int) -> list[int]:
    """The context's last `max_length - max_new` tokens (at least one)."""
    ids = self.tok_encode(context) or [self.prefix_token_id]
    return ids[-(self.max_length - max_new):]

