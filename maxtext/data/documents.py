"""Records -> documents: the first, stateful stage of the input pipeline.

`Loader` turns a (component, record index) pair into a tokenized document or
a `BadRecord`; it runs wherever grain runs the map (worker processes with
`data.num_workers`). `Documents` reads a grain MapDataset of such results
from a record position, by threads or worker processes, and skips bad
records: it counts them, logs each with its file and line (the first
`_WARN_EACH`, then one in `_WARN_EVERY`), or raises in strict mode, and stops
the run when `MAX_CONSECUTIVE_BAD` records in a row are bad (the config is
wrong, not the data).

Its iterator's state is {"next_record", "bad_records"}: the position in the
record stream, not in the workers' output, so it restores with any number of
workers.
"""

from absl import logging
import grain
import numpy as np

from maxtext.data import records as records_lib

# This many bad records in a row stop the run: the config is wrong, not the
# data.
MAX_CONSECUTIVE_BAD = 1000
# Bad records logged one by one; after that, one line per this many.
_WARN_EACH = 100
_WARN_EVERY = 1000


class Loader:
  """Record (component, index) -> document or BadRecord; runs in workers."""

  def __init__(self, sources, encoders):
    self.sources = sources
    self.encoders = encoders

  def __call__(self, pair: tuple[int, int]):
    component, index = pair
    source = self.sources[component]
    encoder = self.encoders[component]
    rid = records_lib.record_id(component, index)
    size = source.size(index)
    if size is not None and size > encoder.max_document_bytes:
      # Never read it: it is larger than the buffer.
      return records_lib.BadRecord(
          rid, f"{size} bytes, more than data.max_document_bytes="
          f"{encoder.max_document_bytes}")
    return encoder.encode(source[index], source.payload, rid)


class DocumentIterator(grain.DatasetIterator):
  """Documents of a record stream from a position; skips bad records.

  The state is {"next_record", "bad_records"}: the next record index of the
  stream and the bad ones seen so far. The stream is read by a fresh grain
  iterator (threads or worker processes) from that index, so the state does
  not depend on how many workers read it.
  """

  def __init__(self, dataset: "Documents"):
    super().__init__()
    self._dataset = dataset
    self._next_record = 0
    self._bad_records = 0
    self._consecutive_bad = 0
    self._reader = None

  def _open(self) -> None:
    dataset = self._dataset
    records = dataset.records[self._next_record:].to_iter_dataset(
        grain.ReadOptions(num_threads=dataset.read_threads,
                          prefetch_buffer_size=dataset.read_buffer))
    if dataset.num_workers:
      records = records.mp_prefetch(grain.MultiprocessingOptions(
          num_workers=dataset.num_workers,
          per_worker_buffer_size=dataset.read_buffer))
    self._reader = iter(records)

  def __next__(self) -> dict[str, np.ndarray]:
    while True:
      if self._reader is None:
        self._open()
      element = next(self._reader)
      self._next_record += 1
      if not isinstance(element, records_lib.BadRecord):
        self._consecutive_bad = 0
        return element
      self._bad_records += 1
      self._consecutive_bad += 1
      self._dataset.on_bad(element, self._bad_records, self._consecutive_bad)

  def get_state(self) -> dict[str, int]:
    return {"next_record": self._next_record,
            "bad_records": self._bad_records}

  def set_state(self, state: dict[str, int]) -> None:
    self.close()
    self._next_record = int(state["next_record"])
    self._bad_records = int(state["bad_records"])
    self._consecutive_bad = 0

  def close(self) -> None:
    if self._reader is not None:
      self._reader.close()
      self._reader = None


class Documents(grain.IterDataset):
  """The documents of `records` (a MapDataset of documents and BadRecords)."""

  def __init__(self, records: grain.MapDataset, *, sources, strict: bool,
               num_workers: int, read_threads: int = 2,
               read_buffer: int = 64):
    super().__init__()
    self.records = records
    self.sources = sources
    self.strict = strict
    self.num_workers = num_workers
    self.read_threads = read_threads
    self.read_buffer = read_buffer

  def __iter__(self) -> DocumentIterator:
    return DocumentIterator(self)

  def on_bad(self, bad: records_lib.BadRecord, count: int,
             consecutive: int) -> None:
    component, index = records_lib.split_record_id(bad.record_id)
    where = self.sources[component].where(index)
    if self.strict:
      raise ValueError(
          f"Bad record at {where}: {bad.reason} (data.strict is set; unset it"
          " to skip bad records).")
    if consecutive >= MAX_CONSECUTIVE_BAD:
      raise ValueError(
          f"The last {consecutive} records were all bad, up to {where}:"
          f" {bad.reason}. Check data.source, data.files and"
          " data.text_field.")
    if count <= _WARN_EACH or count % _WARN_EVERY == 0:
      logging.warning("Skipping bad record at %s: %s (%d bad so far).", where,
                      bad.reason, count)
