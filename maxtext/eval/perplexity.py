"""Perplexity of a model on a dataset of documents.

Documents come from files in any format of the training data
(`maxtext.data.sources`: text, jsonl, parquet, arrayrecord, arrow); each is
tokenized without BOS/EOS and scored whole, in rolling windows of the
scorer's `max_length` tokens, the first token conditioned on `prefix_id`
(BOS, else EOS), as lm-eval's `loglikelihood_rolling` does. Perplexity is
exp(total negative log-likelihood / total tokens) over all documents.
"""

from collections.abc import Sequence
import dataclasses
import math

from maxtext.data import records
from maxtext.data import sources
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.eval import scoring

# Larger records are refused (the data pipeline's read buffer, 64 MiB).
_MAX_DOCUMENT_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Perplexity:
  """Perplexity over documents.

  Attributes:
    perplexity: exp(nll / tokens).
    nll: Summed negative log-likelihood (nats).
    tokens: Tokens scored.
    documents: Documents scored.
  """

  perplexity: float
  nll: float
  tokens: int
  documents: int


def read_documents(patterns: str | Sequence[str], tokenizer:
                   tokenizer_lib.Tokenizer, *, kind: str = "jsonl",
                   text_field: str = "text", text_unit: str = "file",
                   limit: int | None = None) -> list[list[int]]:
  """Token ids of the documents of the files matching `patterns`.

  Args:
    patterns: File paths or glob patterns.
    tokenizer: Encodes the text.
    kind: Source format, one of `sources.SOURCE_KINDS`.
    text_field: Field holding the text (all kinds but text).
    text_unit: For plain text: a document per "file", "paragraph" or
      "line".
    limit: At most this many documents (the first ones).

  Raises:
    ValueError: a record is unusable (names its file and line and why).
    FileNotFoundError: a pattern matches nothing.
  """
  source = sources.make_file_source(kind, patterns, text_field=text_field,
                                    text_unit=text_unit)
  encoder = records.DocumentEncoder(
      tokenizer, text_field=text_field,
      max_document_bytes=_MAX_DOCUMENT_BYTES, add_bos=False, add_eos=False)
  count = len(source) if limit is None else min(limit, len(source))
  documents = []
  for index in range(count):
    document = encoder.encode(source[index], source.payload, index)
    if isinstance(document, records.BadRecord):
      raise ValueError(f"Document {source.where(index)} cannot be scored:"
                       f" {document.reason}.")
    documents.append(document["tokens"].tolist())
  return documents


def perplexity(scorer: scoring.Scorer, documents: Sequence[Sequence[int]], *,
               prefix_id: int) -> Perplexity:
  """Perplexity of the model behind `scorer` on `documents` (token ids).

  Raises:
    ValueError: there are no documents, or one is empty (names it).
  """
  if not documents:
    raise ValueError("No documents to score.")
  nll = -sum(scorer.score_rolling(documents, prefix_id=prefix_id))
  tokens = sum(len(document) for document in documents)
  return Perplexity(perplexity=math.exp(nll / tokens), nll=nll, tokens=tokens,
                    documents=len(documents))
