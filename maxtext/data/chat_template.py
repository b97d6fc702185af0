"""Chat templates: conversations -> token ids with an assistant-only loss mask.

A template is Jinja2 source in Hugging Face's convention (the `chat_template`
of a `tokenizer_config.json`): it renders `messages` (a list of {"role",
"content"}) with `bos_token`, `eos_token` and `add_generation_prompt`, in the
same sandboxed environment `transformers` uses (trim_blocks, lstrip_blocks,
loop controls, `raise_exception`, `tojson`), so a model's own template renders
exactly as in `tokenizer.apply_chat_template(..., tokenize=False)`.

`load_template(spec)` takes a built-in name (`TEMPLATES`), a `.jinja` file, or
a `tokenizer_config.json`.

A message's content is a string, or a list of parts (transformers' format):
`{"type": "text", "text": ...}` and `{"type": "image", ...}` (a path, URL
field or bytes: `image_parts` gives them in order, the caller loads them).
An image part renders as a mark that `encode` replaces with the ids that
image expands into (its entry of `image_ids`: the family's placeholders, one
per soft token, never parsed from text); those ids have loss weight 0.

Only the assistant turns are trained on: `encode_chat` renders each
assistant turn as the difference between the conversation up to it and the
conversation before it with the generation prompt, and gives its tokens (with
its end-of-turn markup) weight 1, every other token weight 0. The template
must render each prefix of a conversation as a prefix of the whole (every
common template does); otherwise the error says which message broke it.
"""

from collections.abc import Mapping, Sequence
import json
import os
import re
from typing import Any

import jinja2
from jinja2 import ext as jinja2_ext
from jinja2 import sandbox as jinja2_sandbox

from maxtext.common import paths
from maxtext.data import tokenizer as tokenizer_lib

# Built-in templates, after the published ones of each family.
TEMPLATES = {
    # Qwen 2.5 / 3, and many others.
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
        " + '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}"),
    # Llama 3 instruct.
    "llama3": (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
        " + message['content'] | trim + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
        "{% endif %}"),
    # Gemma 1/2/3 instruct (the assistant is "model").
    "gemma": (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{% set role = 'model' if message['role'] == 'assistant'"
        " else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim"
        " + '<end_of_turn>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}"
        "{% endif %}"),
    # Mistral 7B instruct v0.1.
    "mistral": (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate"
        " user/assistant/user/assistant/...') }}"
        "{% endif %}"
        "{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}"
        "{{ message['content'] + eos_token }}"
        "{% else %}"
        "{{ raise_exception('Only user and assistant roles are supported!') }}"
        "{% endif %}"
        "{% endfor %}"),
}

ASSISTANT_ROLE = "assistant"


class ChatTemplateError(ValueError):
  """A template failed to render a conversation, or a message is malformed."""


def _raise_exception(message: str):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None,
            sort_keys: bool = False) -> str:
  # Unlike Jinja's own, keeps non-ASCII and does not escape HTML
  # (transformers does the same).
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                    separators=separators, sort_keys=sort_keys)


def compile_template(source: str) -> jinja2.Template:
  """`source` compiled in the environment of `transformers` chat templates."""
  env = jinja2_sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[jinja2_ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  try:
    return env.from_string(source)
  except jinja2.exceptions.TemplateSyntaxError as e:
    raise ChatTemplateError(f"Chat template does not parse: {e}") from e


def user_template(spec: str) -> str:
  """`spec` as the user meant it: a built-in name as it is, a file path
  resolved against the directory they ran from (`paths.user_path`)."""
  return spec if spec in TEMPLATES else paths.user_path(spec)


def load_template(spec: str, key: str = "data.chat_template") -> str:
  """Template source of `spec`: a built-in name, a `.jinja` file or a
  `tokenizer_config.json` with a "chat_template" entry; errors name it as
  `key`.

  Raises:
    ChatTemplateError: `spec` is none of these (the message lists the
      built-in names).
  """
  if spec in TEMPLATES:
    return TEMPLATES[spec]
  if not os.path.isfile(spec):
    raise ChatTemplateError(
        f"{key}={spec!r} is neither a built-in template"
        f" {sorted(TEMPLATES)} nor a file.")
  with open(spec, encoding="utf-8") as f:
    text = f.read()
  if not spec.endswith(".json"):
    return text
  template = json.loads(text).get("chat_template")
  if isinstance(template, list):  # [{"name": "default", "template": ...}]
    template = {t.get("name"): t.get("template") for t in template}.get(
        "default")
  if not isinstance(template, str):
    raise ChatTemplateError(
        f"{spec!r} has no string 'chat_template' (nor a 'default' one).")
  return template


# Where an image part was, in a message's flattened content.
_IMAGE = "\ue002"


def _content_text(i: int, content: Any) -> str:
  """A message's content as one string, each image part an `_IMAGE` mark
  (one a content already held becomes U+FFFD)."""
  if isinstance(content, str):
    return content.replace(_IMAGE, "\ufffd")
  if not isinstance(content, list):
    raise ChatTemplateError(
        f"message {i} content is a {type(content).__name__}; expected a "
        "string or a list of parts")
  text = ""
  for part in content:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
      text += part["text"].replace(_IMAGE, "\ufffd")
    elif kind == "image":
      text += _IMAGE
    else:
      raise ChatTemplateError(
          f"message {i} has a part that is neither {{'type': 'text', "
          f"'text': str}} nor {{'type': 'image', ...}}: {str(part)[:80]!r}")
  return text


def image_parts(messages: Any) -> list[Mapping[str, Any]]:
  """The image parts of `messages`, in the order `encode` places them."""
  return [part for message in messages if isinstance(message, dict)
          and isinstance(message.get("content"), list)
          for part in message["content"]
          if isinstance(part, dict) and part.get("type") == "image"]


def _check_messages(messages: Any, *, assistant: bool = True
                    ) -> list[dict[str, str]]:
  """`messages` with string contents (`_content_text`), checked; with
  `assistant`, one of them must be the assistant's."""
  if not isinstance(messages, list) or not messages:
    raise ChatTemplateError(
        "expected a non-empty list of messages, got"
        f" {type(messages).__name__}")
  flat = []
  for i, message in enumerate(messages):
    if not isinstance(message, dict) or not isinstance(
        message.get("role"), str) or "content" not in message:
      raise ChatTemplateError(
          f"message {i} is not a {{'role': str, 'content': str or parts}} "
          f"object: {str(message)[:80]!r}")
    flat.append({**message,
                 "content": _content_text(i, message["content"])})
  if assistant and not any(m["role"] == ASSISTANT_ROLE for m in flat):
    raise ChatTemplateError("the conversation has no assistant message")
  return flat


# Around each message's content while rendering for `ChatEncoder.encode`:
# the template's own text may hold special tokens, a message's never does.
# Private-use characters, placed inside the content's surrounding whitespace
# so a template's `trim` leaves them around the trimmed text.
_CONTENT_START, _CONTENT_END = "\ue000", "\ue001"
_CONTENT_MARKS = re.compile(f"[{_CONTENT_START}{_CONTENT_END}]")


def _alternatives(texts, *, group: bool = False) -> re.Pattern | None:
  """A regex matching any of `texts`, longest first (a group with `group`,
  so `split` keeps the matches); None for no texts."""
  if not texts:
    return None
  pattern = "|".join(re.escape(text) for text in sorted(
      texts, key=len, reverse=True))
  return re.compile(f"({pattern})" if group else pattern)


def _marked(message: Mapping[str, str]) -> dict[str, str]:
  """`message` with its content between the content marks (any marks the
  content held become U+FFFD)."""
  content = _CONTENT_MARKS.sub("\ufffd", message["content"])
  stripped = content.strip()
  start = content.find(stripped) if stripped else len(content)
  return {**message, "content": (
      content[:start] + _CONTENT_START + stripped + _CONTENT_END
      + content[start + len(stripped):])}


class ChatEncoder:
  """Renders and tokenizes conversations with one template and tokenizer.

  Tokenizing, the template's text may spell special tokens (turn markers,
  BOS/EOS), which become their ids; a message's content never does: a
  literal "<|im_end|>" typed in a message stays text.
  """

  def __init__(self, source: str, tokenizer: tokenizer_lib.Tokenizer):
    self.source = source
    self.tokenizer = tokenizer
    self._template = compile_template(source)
    # Special tokens the template may write as text, mapped to their ids
    # directly (SentencePiece would otherwise spell them out).
    self._specials = {}
    for token_id in (tokenizer.bos_id, tokenizer.eos_id):
      if token_id is not None:
        self._specials[tokenizer.special_text(token_id)] = token_id
    self._special_re = _alternatives(self._specials)
    # What a message's content may not spell as a special token.
    self._literal_re = _alternatives(
        {*self._specials, *tokenizer.special_texts()}, group=True)

  def render(self, messages: Sequence[Mapping[str, str]], *,
             add_generation_prompt: bool = False) -> str:
    """The template's text of `messages`."""
    try:
      return self._template.render(
          messages=list(messages), add_generation_prompt=add_generation_prompt,
          bos_token=self._text_of(self.tokenizer.bos_id),
          eos_token=self._text_of(self.tokenizer.eos_id))
    except jinja2.exceptions.TemplateError as e:
      raise ChatTemplateError(f"chat template failed: {e}") from e

  def _text_of(self, token_id: int | None) -> str:
    return "" if token_id is None else self.tokenizer.special_text(token_id)

  def _encode(self, text: str) -> list[int]:
    if self._special_re is None:
      return self.tokenizer.encode(text, allow_special=True)
    ids, start = [], 0
    for match in self._special_re.finditer(text):
      if match.start() > start:
        ids += self.tokenizer.encode(text[start:match.start()],
                                     allow_special=True)
      ids.append(self._specials[match.group()])
      start = match.end()
    if start < len(text):
      ids += self.tokenizer.encode(text[start:], allow_special=True)
    return ids

  def pieces(self, messages: Any) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, is_assistant_turn) pieces.

    Raises:
      ChatTemplateError: the messages are malformed, the template fails, or
        it does not render prefixes of the conversation as prefixes.
    """
    return [(_CONTENT_MARKS.sub("", text), is_assistant)
            for text, is_assistant in self._marked_pieces(messages)]

  def prompt(self, messages: Any,
             image_ids: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Token ids of `messages` (no assistant turn needed) followed by the
    generation prompt: what a model answers. `image_ids`: what each image
    part becomes, in order (`_ids`)."""
    flat = [_marked(m) for m in _check_messages(messages, assistant=False)]
    ids, _ = self._ids([(self.render(flat, add_generation_prompt=True),
                         False)], image_ids)
    return ids

  def _marked_pieces(self, messages: Any) -> list[tuple[str, bool]]:
    """`pieces`, each message's content between the content marks."""
    messages = [_marked(m) for m in _check_messages(messages)]
    pieces, done = [], ""
    for i, message in enumerate(messages):
      if message["role"] != ASSISTANT_ROLE:
        continue
      prompt = self.render(messages[:i], add_generation_prompt=True)
      turn = self.render(messages[:i + 1])
      if not prompt.startswith(done) or not turn.startswith(prompt):
        raise ChatTemplateError(
            f"the template does not render the conversation up to message {i}"
            " as a prefix of the longer one; it cannot mask assistant turns")
      pieces += [(prompt[len(done):], False), (turn[len(prompt):], True)]
      done = turn
    full = self.render(messages)
    if not full.startswith(done):
      raise ChatTemplateError(
          "the template renders the whole conversation differently from its"
          " last assistant turn; it cannot mask assistant turns")
    pieces.append((full[len(done):], False))
    return [(text, is_assistant) for text, is_assistant in pieces if text]

  def encode(self, messages: Any,
             image_ids: Sequence[Sequence[int]] | None = None
             ) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and their loss weights (1 on assistant
    turns, 0 elsewhere); `image_ids` as in `_ids`.

    Each piece is tokenized whole, as the template renders it, except that
    the text of a special token inside a message's content is tokenized as
    plain text. A template that cuts contents apart (e.g. splitting off a
    reasoning part) leaves no whole contents to tell apart: its rendering is
    then tokenized as before, markup and contents alike.
    """
    return self._ids(self._marked_pieces(messages), image_ids)

  def _ids(self, marked: list[tuple[str, bool]],
           image_ids: Sequence[Sequence[int]] | None = None
           ) -> tuple[list[int], list[int]]:
    """`encode` of rendered (text, is_assistant_turn) pieces: each image
    part becomes the next of `image_ids` (one per image part, in order;
    None: images are off).

    Raises:
      ChatTemplateError: an image part where images are off, or `image_ids`
        for another number of image parts.
    """
    parts = sum(text.count(_IMAGE) for text, _ in marked)
    if image_ids is None and parts:
      raise ChatTemplateError(
          "the conversation has an image part, and images are off "
          "(data.images_per_row=0, or a model without a vision tower)")
    if image_ids is not None and len(image_ids) != parts:
      raise ChatTemplateError(
          f"{len(image_ids)} images' ids given for {parts} image parts")
    next_image = iter(image_ids or ())
    marks = "".join(_CONTENT_MARKS.findall("".join(t for t, _ in marked)))
    if marks != (_CONTENT_START + _CONTENT_END) * (len(marks) // 2):
      marked = [(_CONTENT_MARKS.sub("", text), is_assistant)
                for text, is_assistant in marked]
    ids, weights, in_content = [], [], False

    def add(tokens, weight):
      ids.extend(tokens)
      weights.extend([weight] * len(tokens))

    for text, is_assistant in marked:
      markup = ""
      for part in re.split(f"([{_CONTENT_START}{_CONTENT_END}{_IMAGE}])",
                           text):
        if part in (_CONTENT_START, _CONTENT_END):
          in_content = part == _CONTENT_START
          continue
        if part == _IMAGE:
          add(self._encode(markup), int(is_assistant))
          # Never trained on.
          add(next(next_image), 0)
          markup = ""
          continue
        if not in_content or self._literal_re is None:
          markup += part
          continue
        for i, chunk in enumerate(self._literal_re.split(part)):
          if i % 2:  # A special token's text typed in the content.
            add(self._encode(markup) + self.tokenizer.encode(chunk),
                int(is_assistant))
            markup = ""
          else:
            markup += chunk
      add(self._encode(markup), int(is_assistant))
    return ids, weights
