"""Tokenized documents -> fixed-length rows with segment ids and positions.

Documents ({"tokens", "weights", "record_ids"} of their own length n, see
`maxtext.data.records`) are laid into rows of R = seq_len + 1 tokens
(`PACKINGS`):
  * "concat": concatenated and split at row boundaries (grain's
    ConcatThenSplitIterDataset): no padding except at the end of the data; a
    document cut at a row boundary continues as a new segment of the next row.
  * "first_fit": first-fit bin packing (grain's FirstFitPackIterDataset, as
    many bins as rows per batch): documents are never cut, except those longer
    than a row, which are first split into pieces of R tokens that overlap by
    one (so each of their tokens is still predicted once); rows are padded.
  * "none": one document per row, truncated to R tokens and padded.

Documents with images (a vision-language model: "images" [v, h, w, 3]) fill
a row's `images_per_row` image slots in the order of their tokens (grain's
packers place them along with the tokens; unused slots are zeros). They are
never cut: "concat" is refused, and a document with images is never longer
than a row (`maxtext.data.records`).

Each token of a row has a segment id (1, 2, ... per document piece in the
row; 0 on padding) and a position (0, 1, ... from the start of its segment).
A row becomes one example (`to_example`): inputs = row[:-1],
targets = row[1:], and the target at i counts (mask 1) only where it belongs
to the same segment as input i and its weight is 1, so no prediction crosses
a document boundary and padding never counts. The model attends within
segments (segment_ids) and rotates by the per-segment positions, so a packed
row computes what running each document alone would.

Shapes: L = seq_len; rows are R = L + 1 long.
"""

import grain
import numpy as np

PACKINGS = ("concat", "first_fit", "none")
FEATURES = ("tokens", "weights", "record_ids")
# A vision-language model's documents' images, [v, h, w, 3].
IMAGES = "images"
# What packing adds for the token feature.
SEGMENT_IDS = "tokens_segment_ids"
POSITIONS = "tokens_positions"
# Record id of padding in examples.
NO_RECORD = -1


class _SplitLong(grain.experimental.FlatMapTransform):
  """Cuts documents longer than a row into row-long pieces overlapping by one
  token (piece k holds tokens [k (R - 1), k (R - 1) + R))."""

  def __init__(self, row_len: int, max_fan_out: int):
    self.row_len = row_len
    self.max_fan_out = max_fan_out

  def flat_map(self, document):
    n = len(document["tokens"])
    if n <= self.row_len:
      return [document]
    step = self.row_len - 1
    return [{k: v[start:start + self.row_len] for k, v in document.items()}
            for start in range(0, n - 1, step)]


def _pad_row(document: dict[str, np.ndarray], row_len: int,
             images_per_row: int) -> dict[str, np.ndarray]:
  """One document as a row: truncated to `row_len`, padded with zeros."""
  n = min(len(document["tokens"]), row_len)
  row = {}
  for key in FEATURES:
    value = np.zeros((row_len,), document[key].dtype)
    value[:n] = document[key][:n]
    row[key] = value
  if images_per_row:
    images = document[IMAGES]
    row[IMAGES] = np.zeros((images_per_row, *images.shape[1:]), images.dtype)
    row[IMAGES][:len(images)] = images
  row[SEGMENT_IDS] = (np.arange(row_len) < n).astype(np.int32)
  row[POSITIONS] = np.where(row[SEGMENT_IDS] > 0, np.arange(row_len),
                            0).astype(np.int32)
  return row


def pack(documents: grain.IterDataset, *, packing: str, seq_len: int,
         num_bins: int, max_document_tokens: int,
         images_per_row: int = 0) -> grain.IterDataset:
  """Rows of `seq_len + 1` tokens from `documents` (see the module doc).

  Args:
    documents: Tokenized documents.
    packing: One of `PACKINGS`.
    seq_len: L; rows hold L + 1 tokens.
    num_bins: Rows packed at once by "first_fit".
    max_document_tokens: Bound on a document's tokens, which bounds the
      pieces "first_fit" cuts it into.
    images_per_row: Image slots of a row (0: the documents have none).

  Returns:
    Rows {"tokens", "weights", "record_ids", SEGMENT_IDS, POSITIONS}, each
    of length L + 1, and with `images_per_row` IMAGES [images_per_row, h, w,
    3].
  """
  if packing not in PACKINGS:
    raise ValueError(
        f"data.packing={packing!r} is invalid; valid: {PACKINGS}.")
  if images_per_row and packing == "concat":
    raise ValueError("data.packing='concat' would split images; use "
                     "'first_fit' or 'none'.")
  row_len = seq_len + 1
  lengths = {key: row_len for key in FEATURES}
  kept = (*FEATURES, SEGMENT_IDS, POSITIONS)
  if images_per_row:
    lengths[IMAGES] = images_per_row
    kept += (IMAGES,)
  if packing == "concat":
    return grain.experimental.ConcatThenSplitIterDataset(
        documents, length_struct=lengths)
  if packing == "first_fit":
    pieces = grain.experimental.FlatMapIterDataset(
        documents, _SplitLong(row_len, max(1, -(-max_document_tokens //
                                              (row_len - 1)))))
    rows = grain.experimental.FirstFitPackIterDataset(
        pieces, length_struct=lengths, num_packing_bins=num_bins,
        shuffle_bins=False)
    # Segment ids and positions of one feature are enough.
    return rows.map(lambda row: {k: row[k] for k in kept})
  return documents.map(
      lambda document: _pad_row(document, row_len, images_per_row))


def to_example(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The training example of one row.

  Returns:
    {"inputs", "targets", "mask", "segment_ids", "positions"} int32 [L] and
    "record_ids" int64 [L] (the record of each input token, `NO_RECORD` on
    padding); the row's IMAGES where it has them.
  """
  segments = row[SEGMENT_IDS].astype(np.int32)
  tokens = row["tokens"].astype(np.int32)
  mask = ((segments[1:] == segments[:-1]) & (segments[1:] > 0) &
          (row["weights"][1:] > 0)).astype(np.int32)
  images = {IMAGES: row[IMAGES]} if IMAGES in row else {}
  return {
      **images,
      "inputs": tokens[:-1],
      "targets": tokens[1:],
      "mask": mask,
      "segment_ids": segments[:-1],
      "positions": row[POSITIONS][:-1].astype(np.int32),
      "record_ids": np.where(segments[:-1] > 0, row["record_ids"][:-1],
                             NO_RECORD),
  }
