"""Tests for maxtext.data.pipeline: order, mixtures, sharding, bad records and
exact resumption by record ids."""

import collections
import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.data import packing
from maxtext.data import pipeline
from maxtext.data import records
from maxtext.data.data_config import DataConfig

_WORDS = ("mercy", "strained", "droppeth", "gentle", "rain", "heaven", "place",
          "beneath", "blessed", "twice")


def _text(i: int) -> str:
  rng = np.random.default_rng(i)
  return " ".join(rng.choice(_WORDS, size=3 + i % 11))


def _config(**overrides) -> DataConfig:
  values = dict(
      source="jsonl", files="", text_field="text", text_unit="paragraph",
      mixture={}, tokenizer="", add_bos=True, add_eos=True, chat_template="",
      packing="concat", seq_len=16, shuffle_seed=7, num_workers=0, prefetch=2,
      strict=False, max_document_bytes=1 << 16, eval_source="",
      eval_files="", eval_every_steps=0, eval_steps=3)
  values.update(overrides)
  return DataConfig(**values)


def _record_ids(batches) -> list[list[int]]:
  """Records of each step's batch: sorted ids of its non-padding tokens."""
  return [sorted(set(b["record_ids"][b["record_ids"] >= 0].tolist()))
          for b in batches]


def _take(data: pipeline.Pipeline, steps: int) -> list[dict[str, np.ndarray]]:
  return [next(data) for _ in range(steps)]


def _round_trip(state):
  return json.loads(json.dumps(state))


class PipelineTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.jsonl = self._write_jsonl("docs.jsonl",
                                   [{"text": _text(i)} for i in range(60)])

  def _write_jsonl(self, name: str, objects) -> str:
    path = os.path.join(self.dir, name)
    with open(path, "w", encoding="utf-8") as f:
      for obj in objects:
        f.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    return path

  def _pipeline(self, config=None, *, batch_size=4, **kwargs):
    config = config or _config(files=self.jsonl)
    return pipeline.make_train_pipeline(config, batch_size=batch_size,
                                        vocab_size=32000, **kwargs)

  @parameterized.parameters(*packing.PACKINGS)
  def test_resumed_pipeline_sees_the_records_of_an_uninterrupted_one(
      self, packing_name):
    config = _config(files=self.jsonl, packing=packing_name)
    straight = _take(self._pipeline(config), 30)
    first = self._pipeline(config)
    _take(first, 11)
    state = _round_trip(first.checkpoint_state())
    first.close()
    resumed = self._pipeline(config)
    resumed.restore_checkpoint_state(state)
    rest = _take(resumed, 19)
    self.assertEqual(_record_ids(rest), _record_ids(straight[11:]))
    for a, b in zip(rest, straight[11:]):
      for key in a:
        np.testing.assert_array_equal(a[key], b[key], key)
    # More than one epoch of 60 records was read.
    self.assertGreater(sum(map(len, _record_ids(straight))), 60)

  def test_resumption_is_exact_across_worker_counts(self):
    straight = _take(self._pipeline(_config(files=self.jsonl)), 12)
    with_workers = self._pipeline(_config(files=self.jsonl, num_workers=2))
    head = _take(with_workers, 5)
    state = _round_trip(with_workers.checkpoint_state())
    with_workers.close()
    one_worker = self._pipeline(_config(files=self.jsonl, num_workers=1))
    one_worker.restore_checkpoint_state(state)
    tail = _take(one_worker, 7)
    one_worker.close()
    self.assertEqual(_record_ids(head + tail), _record_ids(straight))
    for a, b in zip(head + tail, straight):
      np.testing.assert_array_equal(a["inputs"], b["inputs"])

  def test_packed_state_refuses_another_process_count(self):
    config = _config(files=self.jsonl)
    shards = [self._pipeline(config, process_index=i, process_count=2)
              for i in range(2)]
    for shard in shards:
      _take(shard, 3)
    states = [shard.get_state() for shard in shards]
    saved = _round_trip(shards[0].checkpoint_state(allgather=lambda _: states))
    single = self._pipeline(config)
    with self.assertRaisesRegex(
        ValueError, r"saved by 2 process\(es\) and this run has 1"):
      single.restore_checkpoint_state(saved)
    # The same process count resumes each process from its own position.
    straight = self._pipeline(config, process_index=1, process_count=2)
    expected = _take(straight, 5)[3:]
    resumed = self._pipeline(config, process_index=1, process_count=2)
    resumed.restore_checkpoint_state(saved)
    self.assertEqual(_record_ids(_take(resumed, 2)), _record_ids(expected))

  def test_processes_read_disjoint_records_that_tile_the_stream(self):
    config = _config(files=self.jsonl, packing="none")

    def rows(**kwargs):  # The record of each row, in order.
      return np.concatenate([b["record_ids"][:, 0] for b in _take(
          self._pipeline(config, **kwargs), 10)]).tolist()

    whole = rows(batch_size=4)
    self.assertEqual(rows(batch_size=4, process_index=0, process_count=2),
                     whole[0::2])
    self.assertEqual(rows(batch_size=4, process_index=1, process_count=2),
                     whole[1::2])

  def test_each_epoch_is_a_new_permutation_of_the_records(self):
    config = _config(files=self.jsonl, packing="none", seq_len=64)
    order = [r for step in _record_ids(_take(self._pipeline(config), 30))
             for r in step]
    indices = [records.split_record_id(r)[1] for r in order]
    self.assertCountEqual(indices[:60], range(60))
    self.assertCountEqual(indices[60:120], range(60))
    self.assertNotEqual(indices[:60], indices[60:120])
    other_seed = _config(files=self.jsonl, packing="none", seq_len=64,
                         shuffle_seed=8)
    self.assertNotEqual(
        _record_ids(_take(self._pipeline(other_seed), 2)),
        _record_ids(_take(self._pipeline(config), 2)))

  def test_mixture_follows_the_weights(self):
    other = self._write_jsonl("other.jsonl",
                              [{"body": _text(100 + i)} for i in range(20)])
    config = _config(source="mixture", packing="none", seq_len=64, mixture={
        "main": {"source": "jsonl", "files": self.jsonl, "weight": 3.0},
        "other": {"source": "jsonl", "files": other, "weight": 1.0,
                  "text_field": "body"}})
    counts = collections.Counter(
        records.split_record_id(r)[0]
        for step in _record_ids(_take(self._pipeline(config), 100))
        for r in step)
    self.assertEqual(sum(counts.values()), 400)
    # Components are in name order: 0 is "main", 1 is "other".
    self.assertAlmostEqual(counts[0] / 400, 0.75, delta=0.01)

  def test_bad_records_are_counted_skipped_and_named(self):
    lines = ['{"text": "good one"}', '{"text": "unterminated',
             '{"text": 3}', '{"text": ""}', '{"text": "' + "x" * 100 + '"}',
             '{"text": "good two"}']
    path = self._write_jsonl("bad.jsonl", lines)
    with open(path, "ab") as f:
      f.write(b'{"text": "caf\xe9"}\n')
    config = _config(files=path, packing="none", max_document_bytes=64)
    data = self._pipeline(config, batch_size=2)
    with self.assertLogs(level="WARNING") as logs:
      seen = [records.split_record_id(r)[1]
              for step in _record_ids(_take(data, 4)) for r in step]
    self.assertCountEqual(seen, [0, 5] * 4)
    messages = "\n".join(logs.output)
    for line, reason in ((2, "invalid JSON"), (3, "field 'text' is int"),
                         (4, "empty text"), (5, "112 bytes, more than"),
                         (7, "not valid UTF-8")):
      self.assertIn(f"{path}:{line}: {reason}", messages)
    # Every record before the position that was not used was counted.
    position = data.get_state()["iterator"]
    self.assertEqual(position["bad_records"], position["next_record"] - 8)
    self.assertGreaterEqual(position["bad_records"], 15)

  def test_strict_mode_stops_at_the_first_bad_record(self):
    path = self._write_jsonl("bad.jsonl", ['{"text": "fine"}', "not json"])
    config = _config(files=path, packing="none", strict=True)
    with self.assertRaisesRegex(ValueError,
                                f"{path}:2: invalid JSON.*data.strict"):
      _take(self._pipeline(config, batch_size=2), 2)

  def test_a_wrong_text_field_stops_the_run(self):
    config = _config(files=self.jsonl, text_field="body")
    with self.assertRaisesRegex(ValueError, "all bad.*no field 'body'"):
      _take(self._pipeline(config), 1)

  def test_state_of_another_config_names_what_changed(self):
    data = self._pipeline()
    _take(data, 2)
    state = data.checkpoint_state()
    with self.assertRaisesRegex(ValueError, "seq_len: saved 16, now 32"):
      self._pipeline(_config(files=self.jsonl, seq_len=32)
                     ).restore_checkpoint_state(state)

  def test_synthetic_resumes_on_another_process_count(self):
    config = _config(source="synthetic")
    shards = [pipeline.make_train_pipeline(
        config, batch_size=4, vocab_size=50, process_index=i, process_count=2)
              for i in range(2)]
    for shard in shards:
      _take(shard, 3)
    saved = _round_trip(shards[0].checkpoint_state())
    self.assertEqual(saved, _round_trip(shards[1].checkpoint_state()))
    expected = np.concatenate([next(shard)["inputs"] for shard in shards])
    single = pipeline.make_train_pipeline(config, batch_size=4, vocab_size=50)
    single.restore_checkpoint_state(saved)
    batch = next(single)
    self.assertEqual(sorted(map(bytes, batch["inputs"])),
                     sorted(map(bytes, expected)))
    self.assertTrue(np.all((batch["inputs"] >= 0) & (batch["inputs"] < 50)))
    np.testing.assert_array_equal(batch["inputs"][:, 1:],
                                  batch["targets"][:, :-1])

  def test_eval_batches_cover_the_split_once_then_are_empty(self):
    eval_path = self._write_jsonl("eval.jsonl",
                                  [{"text": _text(i)} for i in range(5)])
    config = _config(files=self.jsonl, eval_files=eval_path, packing="none",
                     eval_steps=4, seq_len=64)
    batches = list(pipeline.eval_batches(config, batch_size=2,
                                         vocab_size=32000))
    self.assertLen(batches, 4)
    seen = [records.split_record_id(r)[1] for step in _record_ids(batches)
            for r in step]
    self.assertEqual(seen, [0, 1, 2, 3, 4])
    self.assertEqual(batches[2]["mask"][1].sum(), 0)  # Padding row.
    self.assertEqual(batches[3]["mask"].sum(), 0)  # Past the end.
    for batch in batches:
      self.assertEqual(batch["inputs"].shape, (2, 64))

  def test_default_text_is_the_bundled_corpus(self):
    data = self._pipeline(_config(source="text"))
    batch = next(data)
    self.assertEqual(batch["inputs"].shape, (4, 16))
    self.assertGreater(data.fingerprint["sources"][0][1], 10_000)

  def test_tokenizer_larger_than_model_vocab(self):
    with self.assertRaisesRegex(ValueError, "32000 ids.*vocab_size is 1000"):
      pipeline.make_train_pipeline(_config(files=self.jsonl), batch_size=4,
                                   vocab_size=1000)

  def test_batch_size_must_divide_over_processes(self):
    with self.assertRaisesRegex(ValueError, "divisible"):
      self._pipeline(batch_size=3, process_count=2)

  @parameterized.named_parameters(
      ("source", dict(source="tfrecord"), "data.source='tfrecord'"),
      ("seq_len", dict(seq_len=0), "data.seq_len=0"),
      ("packing", dict(packing="greedy"), "data.packing='greedy'"),
      ("workers", dict(num_workers=-1), "data.num_workers=-1"),
      ("files", dict(source="parquet", files=""),
       "'parquet' needs data.files"),
      ("mixture", dict(source="mixture"), "needs components"),
      ("component", dict(source="mixture", mixture={
          "a": {"source": "csv", "files": "x", "weight": 1.0}}),
       "data.mixture.a.source='csv'"),
      ("component_key", dict(source="mixture", mixture={
          "a": {"source": "jsonl", "files": "x", "weight": 1.0, "w": 2}}),
       r"Unknown key\(s\) \['w'\] in data.mixture.a"),
      ("eval_files", dict(eval_every_steps=5), "needs data.eval_files"),
      ("eval_source", dict(source="synthetic", eval_every_steps=5,
                           eval_files="x"), "got 'synthetic'"),
  )
  def test_invalid_config_values(self, overrides, message):
    with self.assertRaisesRegex(ValueError, message):
      _config(**{"files": "x.jsonl", **overrides})


if __name__ == "__main__":
  absltest.main()
