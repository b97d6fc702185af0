"""Raw records -> tokenized documents, or the reason a record is bad.

`DocumentEncoder.encode(raw, payload)` parses one raw record of a source (see
`maxtext.data.sources`) and tokenizes it:
  * plain text: `[BOS] + encode(text) + [EOS]` (each only if `add_bos` /
    `add_eos` and the vocabulary has it), every token weighted 1;
  * with a chat template, the field holds a list of messages and the
    template's markup (BOS/EOS included) comes from the template; only the
    assistant turns have weight 1.

A record is bad, with a reason, when it is larger than `max_document_bytes`
(the read buffer), not UTF-8, not a JSON object, lacks the field, has a field
of the wrong type, or is empty. `encode` then returns a `BadRecord` instead of
raising, so that a worker process never dies on data; the pipeline counts it
and warns with the record's file and line (or raises in strict mode).

A document is a dict of three int arrays of its length n: "tokens",
"weights" (loss weight of each token as a prediction target) and
"record_ids" (its record id, `record_id(source, index)`, on every token);
for a vision-language model also "images", float32 [v, h, w, 3] (v may be
0): its conversation's image parts in order (`images.ImageReader`). A
missing, truncated or non-image file, more images than a row holds, or a
document with images longer than a row makes the record bad.
"""

from collections.abc import Callable
import dataclasses
import json
from typing import Any

import numpy as np

from maxtext.data import chat_template as chat_lib
from maxtext.data import images as images_lib
from maxtext.data import tokenizer as tokenizer_lib

# Record ids pack (source index, record index) into one int64.
_INDEX_BITS = 40


def record_id(source: int, index: int) -> int:
  """The id of record `index` of mixture component `source`."""
  return (source << _INDEX_BITS) | index


def split_record_id(rid: int) -> tuple[int, int]:
  """(source, index) of a record id."""
  return rid >> _INDEX_BITS, rid & ((1 << _INDEX_BITS) - 1)


@dataclasses.dataclass(frozen=True)
class BadRecord:
  """A record that could not be used.

  Attributes:
    record_id: Its id.
    reason: What is wrong, e.g. "invalid JSON: Expecting value at column 1".
  """

  record_id: int
  reason: str


def _describe(value: Any) -> str:
  return "null" if value is None else type(value).__name__


class DocumentEncoder:
  """Parses and tokenizes raw records (picklable into worker processes).

  Attributes:
    tokenizer: The tokenizer.
    text_field: Field of JSON, Parquet and Arrow records to read.
    max_document_bytes: Larger records are bad.
    add_bos: Start plain-text documents with BOS.
    add_eos: End plain-text documents with EOS.
    chat: Renders conversations; None for plain text.
    images: Reads the conversations' image parts (a vision-language
      model); None: text only.
    image_field: A field (column) of each record with its images, which
      image parts without data of their own take in order (Hugging Face
      datasets' image column); "": none.
    row_tokens: With `images`, the most tokens of a document with images
      (a row's: its images are never split).
    image_ids: With `images`, grid -> the ids an image part becomes
      (`ImageInputs.prompt_ids` with the tokenizer); None: the chat
      encoder's own.
  """

  def __init__(self, tokenizer: tokenizer_lib.Tokenizer, *, text_field: str,
               max_document_bytes: int, add_bos: bool, add_eos: bool,
               chat: chat_lib.ChatEncoder | None = None,
               images: images_lib.ImageReader | None = None,
               row_tokens: int = 0, image_field: str = "",
               image_ids: Callable[[Any], list[int]] | None = None):
    self.tokenizer = tokenizer
    self.text_field = text_field
    self.max_document_bytes = max_document_bytes
    self.chat = chat
    self.images = images
    self.row_tokens = row_tokens
    self.image_field = image_field
    self.image_ids = image_ids
    self._bos = ([tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None
                 else [])
    self._eos = ([tokenizer.eos_id] if add_eos and tokenizer.eos_id is not None
                 else [])

  def _too_large(self, size: int) -> str | None:
    if size > self.max_document_bytes:
      return (f"{size} bytes, more than data.max_document_bytes="
              f"{self.max_document_bytes}")
    return None

  def _field(self, raw: Any, payload: str) -> tuple[Any, Any]:
    """(The field's value, the record's `image_field` value or None);
    raises ValueError with the reason it is bad."""
    size = len(raw.encode("utf-8")) if isinstance(raw, str) else (
        len(raw) if isinstance(raw, bytes) else 0)
    if reason := self._too_large(size):
      raise ValueError(reason)
    if payload == "value":
      if self.image_field:  # A row of both columns.
        return raw[self.text_field], raw[self.image_field]
      return raw, None
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(
          f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if payload == "text":
      return text, None
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(
          f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
      raise ValueError("invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
      raise ValueError(f"a JSON {_describe(obj)}, expected an object")
    if self.text_field not in obj:
      raise ValueError(
          f"no field {self.text_field!r} (fields: {sorted(obj)[:10]})")
    return obj[self.text_field], obj.get(self.image_field)

  def encode(self, raw: Any, payload: str,
             rid: int) -> dict[str, np.ndarray] | BadRecord:
    """The document of one raw record, or why it is bad.

    Args:
      raw: The record as its source returns it.
      payload: "text", "json" or "value" (see `maxtext.data.sources`).
      rid: The record's id, stored on each token.
    """
    try:
      value, column_images = self._field(raw, payload)
      images = per_image_ids = None
      if self.images is not None:
        images, grids = self.images.read(chat_lib.image_parts(value),
                                         column_images)
        if self.image_ids is not None:
          per_image_ids = [self.image_ids(grid) for grid in grids]
      if self.chat is not None:
        try:
          ids, weights = self.chat.encode(value, per_image_ids)
        except chat_lib.ChatTemplateError as e:
          raise ValueError(str(e)) from None
      else:
        ids, weights = self._encode_text(value)
      if images is not None:
        if len(images) and len(ids) > self.row_tokens:
          raise ValueError(
              f"{len(ids)} tokens with images, more than a row holds "
              f"(data.seq_len + 1 = {self.row_tokens}): an image's tokens "
              "are never split")
    except ValueError as e:  # ImageError included.
      return BadRecord(rid, str(e))
    document = {"tokens": np.asarray(ids, np.int32),
                "weights": np.asarray(weights, np.int32),
                "record_ids": np.full(len(ids), rid, np.int64)}
    if images is not None:
      document["images"] = images
    return document

  def _encode_text(self, value: Any) -> tuple[list[int], list[int]]:
    if not isinstance(value, str):
      raise ValueError(
          f"field {self.text_field!r} is {_describe(value)}, expected a"
          " string")
    if not value.strip():
      raise ValueError("empty text")
    ids = self._bos + self.tokenizer.encode(value) + self._eos
    return ids, [1] * len(ids)
