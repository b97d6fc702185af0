"""Tests for maxtext.data.pipeline."""

import collections
import os

from absl.testing import absltest
import numpy as np

from maxtext.data import pipeline

_TEXT = " ".join(f"Line {i}: the quality of mercy is not strained." for i in
                 range(40))


def _config(**overrides) -> pipeline.DataConfig:
  values = dict(source="text", text_files="", tokenizer="", seq_len=16,
                shuffle_seed=7)
  values.update(overrides)
  return pipeline.DataConfig(**values)


class PipelineTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = self.create_tempfile("play.txt", content=_TEXT).full_path
    self.config = _config(text_files=self.path)

  def _batches(self, config=None, **kwargs):
    source = pipeline.make_source(config or self.config, vocab_size=32000)
    return source, pipeline.make_batches(
        source, batch_size=4, seed=(config or self.config).shuffle_seed,
        **kwargs)

  def test_batch_is_a_pure_function_of_seed_and_step(self):
    _, first = self._batches()
    _, second = self._batches()
    for step in (0, 3, 17, 1000):
      for key in ("inputs", "targets", "mask"):
        np.testing.assert_array_equal(first[step][key], second[step][key])
    _, other_seed = self._batches(_config(text_files=self.path, shuffle_seed=8))
    self.assertFalse(np.array_equal(first[0]["inputs"],
                                    other_seed[0]["inputs"]))

  def test_iterate_from_step_matches_random_access(self):
    _, batches = self._batches()
    iterator = pipeline.iterate(batches, 5)
    for step in range(5, 9):
      batch = next(iterator)
      self.assertEqual(batch["inputs"].shape, (4, 16))
      np.testing.assert_array_equal(batch["inputs"], batches[step]["inputs"])

  def test_each_epoch_is_a_permutation_of_the_windows(self):
    source, batches = self._batches()
    num_windows = len(source)
    self.assertGreater(num_windows, 4)
    seen = np.concatenate([batches[s]["inputs"] for s in range(
        -(-2 * num_windows // 4) + 1)])
    windows = {source[i]["inputs"].tobytes(): i for i in range(num_windows)}
    order = [windows[row.tobytes()] for row in seen]
    self.assertCountEqual(order[:num_windows], range(num_windows))
    self.assertCountEqual(order[num_windows:2 * num_windows],
                          range(num_windows))
    self.assertNotEqual(order[:num_windows], order[num_windows:2 * num_windows])

  def test_process_rows_tile_the_global_batch(self):
    _, global_batches = self._batches()
    parts = [self._batches(process_index=i, process_count=2)[1][3]
             for i in range(2)]
    np.testing.assert_array_equal(
        np.concatenate([p["targets"] for p in parts]),
        global_batches[3]["targets"])

  def test_synthetic_source_is_deterministic_and_in_vocab(self):
    config = _config(source="synthetic")
    a = pipeline.make_source(config, vocab_size=50)
    b = pipeline.make_source(config, vocab_size=50)
    np.testing.assert_array_equal(a[11]["inputs"], b[11]["inputs"])
    np.testing.assert_array_equal(a[11]["inputs"][1:], a[11]["targets"][:-1])
    counts = collections.Counter(a[0]["inputs"].tolist())
    self.assertTrue(all(0 <= t < 50 for t in counts))

  def test_default_text_is_the_bundled_corpus(self):
    source = pipeline.make_source(_config(seq_len=256), vocab_size=32000)
    self.assertGreater(len(source), 1000)

  def test_tokenizer_larger_than_model_vocab(self):
    with self.assertRaisesRegex(ValueError, "32000 ids.*vocab_size is 1000"):
      pipeline.make_source(self.config, vocab_size=1000)

  def test_bad_tokenizer_path_is_named(self):
    with self.assertRaisesRegex(FileNotFoundError, "/no/such/tokenizer.model"):
      pipeline.make_source(_config(text_files=self.path,
                                   tokenizer="/no/such/tokenizer.model"),
                           vocab_size=32000)

  def test_invalid_config_values(self):
    with self.assertRaisesRegex(ValueError, "data.source='tfrecord'"):
      _config(source="tfrecord")
    with self.assertRaisesRegex(ValueError, "data.seq_len=0"):
      _config(seq_len=0)

  def test_batch_size_must_divide_over_processes(self):
    source = pipeline.make_source(self.config, vocab_size=32000)
    with self.assertRaisesRegex(ValueError, "divisible"):
      pipeline.make_batches(source, batch_size=3, seed=0, process_count=2)

  def test_text_files_directory_glob(self):
    other = os.path.join(os.path.dirname(self.path), "*.txt")
    self.assertNotEmpty(pipeline.make_source(
        _config(text_files=other), vocab_size=32000))


if __name__ == "__main__":
  absltest.main()
