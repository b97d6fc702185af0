"""Tests for maxtext.data.packing: a packed row computes what each document
alone would, and every target counts exactly where it should."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import grain
import jax
import numpy as np

from maxtext.data import packing
from maxtext.models import registry
from testing import tiny_configs
from testing import trees

_SEQ_LEN = 16
# Token ids are unique over all documents, so each names its place.
_LENGTHS = (5, 12, 3, 40, 7, 17, 9, 2)
_VOCAB = 256


def _documents() -> list[dict[str, np.ndarray]]:
  tokens = np.random.default_rng(0).permutation(_VOCAB)[:sum(_LENGTHS)]
  documents, start = [], 0
  for i, n in enumerate(_LENGTHS):
    documents.append({"tokens": tokens[start:start + n].astype(np.int32),
                      "weights": np.ones(n, np.int32),
                      "record_ids": np.full(n, i, np.int64)})
    start += n
  return documents


def _examples(packing_name: str, documents) -> list[dict[str, np.ndarray]]:
  rows = packing.pack(
      grain.MapDataset.source(documents).to_iter_dataset(),
      packing=packing_name, seq_len=_SEQ_LEN, num_bins=3,
      max_document_tokens=64)
  return [packing.to_example(row) for row in rows]


class PackingTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cfg = dataclasses.replace(
        tiny_configs.tiny_model_config("gemma3", window=4), vocab_size=_VOCAB)
    cls.model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    cls.forward = staticmethod(jax.jit(
        lambda tokens, positions, segments: cls.model(
            tokens, positions_BL=positions, segment_ids_BL=segments)))

  def _alone(self, tokens: np.ndarray) -> np.ndarray:
    n = len(tokens)
    return np.asarray(self.forward(tokens[None], np.arange(n)[None],
                                   np.ones((1, n), np.int32)))[0]

  @parameterized.parameters(*packing.PACKINGS)
  def test_packed_rows_compute_each_document_alone(self, packing_name):
    documents = _documents()
    examples = _examples(packing_name, documents)
    segments_seen = 0
    for example in examples:
      logits = np.asarray(self.forward(
          example["inputs"][None], example["positions"][None],
          example["segment_ids"][None]))[0]
      for segment in np.unique(example["segment_ids"][
          example["segment_ids"] > 0]):
        where = np.flatnonzero(example["segment_ids"] == segment)
        np.testing.assert_array_equal(where, np.arange(where[0],
                                                       where[-1] + 1))
        np.testing.assert_array_equal(example["positions"][where],
                                      np.arange(len(where)))
        tokens = example["inputs"][where]
        # The segment is a contiguous piece of the document it names.
        rid = example["record_ids"][where[0]]
        np.testing.assert_array_equal(example["record_ids"][where], rid)
        doc = documents[rid]["tokens"].tolist()
        offset = doc.index(tokens[0])
        self.assertEqual(doc[offset:offset + len(tokens)], tokens.tolist())
        trees.assert_close(logits[where], self._alone(tokens), rtol=1e-5,
                           atol=1e-5, scaled_atol=1e-5)
        segments_seen += 1
    self.assertGreater(segments_seen, len(_LENGTHS) - 1)

  @parameterized.parameters(*packing.PACKINGS)
  def test_targets_are_next_tokens_of_the_same_document(self, packing_name):
    documents = _documents()
    next_token = {}
    for document in documents:
      tokens = document["tokens"].tolist()
      next_token.update(zip(tokens[:-1], tokens[1:]))
    predicted = []
    for example in _examples(packing_name, documents):
      counted = example["mask"] == 1
      for source, target in zip(example["inputs"][counted],
                                example["targets"][counted]):
        self.assertEqual(next_token.get(int(source)), int(target))
      predicted += example["targets"][counted].tolist()
      # Padding never counts and carries no record.
      padding = example["segment_ids"] == 0
      self.assertFalse(np.any(example["mask"][padding]))
      np.testing.assert_array_equal(example["record_ids"][padding],
                                    packing.NO_RECORD)
    self.assertLen(predicted, len(set(predicted)))
    all_targets = {t for d in documents for t in d["tokens"][1:].tolist()}
    missed = all_targets - set(predicted)
    if packing_name == "first_fit":
      # Nothing is cut: long documents are split with a one-token overlap.
      self.assertEmpty(missed)
    elif packing_name == "concat":
      # One target is lost where a document crosses a row boundary.
      rows = len(_examples(packing_name, documents))
      self.assertLessEqual(len(missed), rows - 1)
    else:
      # "none" keeps the first seq_len targets of each document.
      self.assertLen(predicted, sum(min(n - 1, _SEQ_LEN) for n in _LENGTHS))

  def test_example_of_a_hand_made_row(self):
    row = {
        "tokens": np.array([1, 10, 11, 2, 1, 20, 0]),
        "weights": np.array([1, 1, 1, 1, 1, 0, 0]),
        "record_ids": np.array([4, 4, 4, 4, 9, 9, 0]),
        packing.SEGMENT_IDS: np.array([1, 1, 1, 1, 2, 2, 0]),
        packing.POSITIONS: np.array([0, 1, 2, 3, 0, 1, 0]),
    }
    example = packing.to_example(row)
    np.testing.assert_array_equal(example["inputs"], [1, 10, 11, 2, 1, 20])
    np.testing.assert_array_equal(example["targets"], [10, 11, 2, 1, 20, 0])
    # 2 -> 1 crosses documents; 1 -> 20 has weight 0; 20 -> pad is padding.
    np.testing.assert_array_equal(example["mask"], [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(example["segment_ids"], [1, 1, 1, 1, 2, 2])
    np.testing.assert_array_equal(example["positions"], [0, 1, 2, 3, 0, 1])
    np.testing.assert_array_equal(example["record_ids"], [4, 4, 4, 4, 9, 9])

  def test_unknown_packing_is_named(self):
    with self.assertRaisesRegex(ValueError, "data.packing='greedy'"):
      packing.pack(grain.MapDataset.source([]).to_iter_dataset(),
                   packing="greedy", seq_len=4, num_bins=1,
                   max_document_tokens=8)


if __name__ == "__main__":
  absltest.main()
