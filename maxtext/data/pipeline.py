"""The input pipeline: sources -> mixture -> documents -> packed rows -> batches.

Training data of one process, in order:
  1. records: each source (`data.source`, or every component of
     `data.mixture`) is shuffled per epoch with grain's index shuffle (its own
     seed, a new permutation each epoch) and repeated; components are mixed
     by weight (`grain.MapDataset.mix`). Process p of P reads every P-th
     record of the mixed stream.
  2. documents: each record is read, parsed and tokenized
     (`maxtext.data.records`) by `data.num_workers` grain worker processes
     (0: threads of this process). Bad records are counted, logged with
     their file and line and skipped, or stop the run with `data.strict`
     (`maxtext.data.documents`).
  3. rows: documents are packed into rows of `seq_len + 1` tokens with
     segment ids and per-segment positions (`maxtext.data.packing`), turned
     into examples and batched, `batch_size / P` rows per process, and
     `data.prefetch` batches are read ahead by a background thread.

For a vision-language model (`data.images_per_row` > 0, `image_inputs`
from the model) each chat record's image parts are read and preprocessed
with it (`maxtext.data.images`), their placeholder ids expanded by the chat
template, and each row carries "images" [images_per_row, h, w, 3] in the
order of its placeholders.

The position of the pipeline is its grain iterator state: the index of the
next record of stage 1 and the packer's partial rows (as the record position
to replay from). It is JSON, saved with every checkpoint, and restoring it
makes the run read exactly the batches an uninterrupted run would have read.
Because the record position counts records of the mixed stream, not worker
output, a run may resume with another `data.num_workers`; the per-process
packers' positions, though, are per process, so a packed pipeline resumes
only with the same number of processes (a clear error says so). The
synthetic source has no packing and is resumable on any number of processes
(grain's ElasticIterator, whose state is the global example index).

Shapes: B batch (per process), L sequence length.
"""

from collections.abc import Iterator, Mapping
import json
from typing import Any

import grain
import numpy as np

from maxtext.data import assets
from maxtext.data import chat_template as chat_lib
from maxtext.data import documents as documents_lib
from maxtext.data import images as images_lib
from maxtext.data import packing as packing_lib
from maxtext.data import records as records_lib
from maxtext.data import sources as sources_lib
from maxtext.data import synthetic_source
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.data.data_config import DataConfig
from maxtext.data.data_config import MixtureComponent

# Keys of a batch that the model and loss read (the rest is for tests).
MODEL_KEYS = ("inputs", "targets", "mask", "segment_ids", "positions")
# Synthetic rows are not packed: no segments.
_SYNTHETIC_KEYS = ("inputs", "targets", "mask")
# Version of the saved state's layout.
_STATE_FORMAT = 1


def make_tokenizer(config: DataConfig) -> tokenizer_lib.Tokenizer:
  """The configured tokenizer, or the bundled one when none is set."""
  return tokenizer_lib.load_tokenizer(
      config.tokenizer or assets.default_tokenizer())


def _seed(*values: int) -> int:
  return int(np.random.SeedSequence(values).generate_state(1)[0])


class Pipeline:
  """Batches of one process with a saveable position.

  Iterate to get batches: numpy dicts of `MODEL_KEYS` ([B, L] int32; the
  synthetic source has no segment ids or positions) plus "record_ids"
  ([B, L] int64 record id of each input token, -1 on padding) for packed
  pipelines.

  Attributes:
    model_keys: The batch keys the model reads.
    fingerprint: What must not change for a saved state to apply.
    elastic: The state is the same on every process and restores on any
      number of processes.
  """

  def __init__(self, dataset: grain.IterDataset, *, fingerprint: dict,
               model_keys: tuple[str, ...], elastic: bool,
               process_index: int, process_count: int):
    self._dataset = dataset
    self.fingerprint = fingerprint
    self.model_keys = model_keys
    self.elastic = elastic
    self.process_index = process_index
    self.process_count = process_count
    self._iterator = None

  @property
  def iterator(self) -> grain.DatasetIterator:
    if self._iterator is None:
      self._iterator = iter(self._dataset)
    return self._iterator

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self.iterator)

  def get_state(self) -> dict[str, Any]:
    """This process's position (JSON-able)."""
    return {"format": _STATE_FORMAT, "fingerprint": self.fingerprint,
            "iterator": self.iterator.get_state()}

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Continues from a `get_state()` of a pipeline of the same config.

    Raises:
      ValueError: the state is of another data config (names what changed).
    """
    saved = state.get("fingerprint", {})
    changed = sorted(k for k in set(saved) | set(self.fingerprint)
                     if _jsonable(saved.get(k)) != _jsonable(
                         self.fingerprint.get(k)))
    if state.get("format") != _STATE_FORMAT or changed:
      details = "; ".join(f"{k}: saved {saved.get(k)!r}, now"
                          f" {self.fingerprint.get(k)!r}" for k in changed)
      raise ValueError(
          "The saved data position does not fit this data config"
          f" ({details or 'another state format'}). Resume with the config"
          " the checkpoint was written with, or start a new workdir.")
    self.iterator.set_state(_from_json(state["iterator"]))

  def checkpoint_state(self, allgather=None) -> dict[str, Any]:
    """The position of every process, to save with a checkpoint.

    Args:
      allgather: `(local state) -> [state of each process]`, called on every
        process at once; default `jax.experimental.multihost_utils` based.
    """
    local = self.get_state()
    if self.elastic or self.process_count == 1:
      return {"processes": [local]}
    allgather = allgather or _allgather_json
    return {"processes": list(allgather(local))}

  def restore_checkpoint_state(self, state: Mapping[str, Any]) -> None:
    """Continues from a `checkpoint_state()`.

    Raises:
      ValueError: the state was saved by another number of processes and the
        pipeline is not elastic, or by another data config.
    """
    processes = state["processes"]
    if self.elastic:
      self.set_state(processes[0])
      return
    if len(processes) != self.process_count:
      raise ValueError(
          f"The checkpoint's data position was saved by {len(processes)}"
          f" process(es) and this run has {self.process_count}: packed data"
          " pipelines keep per-process partial rows, so they resume only on"
          " the same number of processes (data.source='synthetic' resumes on"
          " any). Use the same number of processes, or start a new workdir.")
    self.set_state(processes[self.process_index])

  def close(self) -> None:
    if self._iterator is not None:
      self._iterator.close()
      self._iterator = None


def _jsonable(value: Any) -> Any:
  return json.loads(json.dumps(value))


def _from_json(state: Any) -> Any:
  """A state after a JSON round trip, with lists back as tuples (grain's
  packers compare slices to tuples)."""
  if isinstance(state, Mapping):
    return {k: _from_json(v) for k, v in state.items()}
  if isinstance(state, list):
    return tuple(_from_json(v) for v in state)
  return state


def _allgather_json(local: Mapping[str, Any]) -> list[Any]:
  """Every process's `local`, via a JSON byte all-gather over jax."""
  # Imported here: only multi-process runs with packing need collectives.
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  data = np.frombuffer(json.dumps(local).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([len(data)], np.int64))
  padded = np.zeros((int(np.max(sizes)),), np.uint8)
  padded[:len(data)] = data
  gathered = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode())
          for row, n in zip(gathered, np.ravel(sizes))]


def _encoders_and_sources(config: DataConfig, components, *, vocab_size: int,
                          image_inputs: images_lib.ImageInputs | None):
  if config.images_per_row and image_inputs is None:
    raise ValueError(
        f"data.images_per_row={config.images_per_row} needs a model with a "
        "vision tower (model.vision_layers > 0).")
  tokenizer = make_tokenizer(config)
  if tokenizer.vocab_size > vocab_size:
    raise ValueError(
        f"Tokenizer {tokenizer.path!r} has {tokenizer.vocab_size} ids but the"
        f" model's vocab_size is {vocab_size}; use a matching tokenizer or"
        " raise model.vocab_size.")
  chat = reader = image_ids = None
  if config.chat_template:
    if config.images_per_row:
      image_ids = image_inputs.ids_for(tokenizer)
      reader = images_lib.ImageReader(image_inputs.settings, config.image_dir,
                                      config.images_per_row,
                                      image_inputs.pixels)
    chat = chat_lib.ChatEncoder(chat_lib.load_template(config.chat_template),
                                tokenizer)
  sources, encoders = [], []
  for _, component in components:
    text_field = component.text_field or config.text_field
    sources.append(sources_lib.make_file_source(
        component.source, component.files, text_field=text_field,
        text_unit=config.text_unit, image_field=config.image_field))
    if not len(sources[-1]):
      raise ValueError(f"{component.source} files {component.files!r} hold"
                       " no records.")
    encoders.append(records_lib.DocumentEncoder(
        tokenizer, text_field=text_field,
        max_document_bytes=config.max_document_bytes, add_bos=config.add_bos,
        add_eos=config.add_eos, chat=chat, images=reader,
        row_tokens=config.seq_len + 1, image_field=config.image_field,
        image_ids=image_ids))
  fingerprint = {
      "sources": [[c.source, len(s), c.weight, e.text_field]
                  for (_, c), s, e in zip(components, sources, encoders)],
      "text_unit": config.text_unit,
      "tokenizer": [tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id],
      "add_bos_eos": [config.add_bos, config.add_eos],
      "chat_template": config.chat_template,
      "packing": config.packing,
      "seq_len": config.seq_len,
      "images_per_row": config.images_per_row,
      "image_field": config.image_field,
  }
  return sources, encoders, fingerprint


def _packed(config: DataConfig, records: grain.MapDataset, sources,
            *, rows: int, drop_remainder: bool) -> grain.IterDataset:
  """Documents of `records` -> packed examples -> batches of `rows`."""
  documents = documents_lib.Documents(
      records, sources=sources, strict=config.strict,
      num_workers=config.num_workers)
  examples = packing_lib.pack(
      documents, packing=config.packing, seq_len=config.seq_len,
      num_bins=rows, max_document_tokens=config.max_document_bytes + 2,
      images_per_row=config.images_per_row).map(packing_lib.to_example)
  return examples.batch(rows, drop_remainder=drop_remainder)


def _process_rows(batch_size: int, process_count: int) -> int:
  if batch_size < 1 or batch_size % process_count:
    raise ValueError(
        f"Global batch size {batch_size} must be positive and divisible by the"
        f" number of processes ({process_count}).")
  return batch_size // process_count


def model_keys(config: DataConfig) -> tuple[str, ...]:
  """The batch keys of `config`'s training pipeline (what the model reads):
  packed sources add per-token segment ids and positions, image slots add
  the images."""
  if config.source == "synthetic":
    return _SYNTHETIC_KEYS
  return MODEL_KEYS + ((packing_lib.IMAGES,) if config.images_per_row else ())


def make_train_pipeline(config: DataConfig, *, batch_size: int,
                        vocab_size: int, process_index: int = 0,
                        process_count: int = 1,
                        image_inputs: images_lib.ImageInputs | None = None
                        ) -> Pipeline:
  """The training batches of this process (see the module doc).

  Args:
    config: The data section.
    batch_size: Global batch size, divisible by `process_count`.
    vocab_size: The model's vocabulary size; token ids must be below it.
    process_index: This process.
    process_count: Number of processes sharing the global batch.
    image_inputs: A vision-language model's, for `data.images_per_row`.

  Raises:
    ValueError: the config does not fit the model or the data (names it).
    FileNotFoundError: a file pattern matches nothing, or the tokenizer is
      missing.
  """
  rows = _process_rows(batch_size, process_count)
  if config.source == "synthetic":
    examples = grain.MapDataset.source(synthetic_source.SyntheticTokens(
        vocab_size=vocab_size, seq_len=config.seq_len,
        seed=config.shuffle_seed)).repeat(None)
    batches = grain.experimental.ElasticIterator(
        examples, batch_size,
        grain.sharding.ShardOptions(process_index, process_count),
        read_options=grain.ReadOptions(num_threads=1,
                                       prefetch_buffer_size=2 * rows),
        multiprocessing_options=(
            grain.MultiprocessingOptions(num_workers=config.num_workers)
            if config.num_workers else None))
    fingerprint = {"source": "synthetic", "seq_len": config.seq_len,
                   "vocab_size": vocab_size}
    return Pipeline(_prefetched(batches, config.prefetch),
                    fingerprint=fingerprint,
                    model_keys=model_keys(config), elastic=True,
                    process_index=process_index, process_count=process_count)

  components = config.components()
  sources, encoders, fingerprint = _encoders_and_sources(
      config, components, vocab_size=vocab_size, image_inputs=image_inputs)
  streams = [
      grain.MapDataset.range(len(source)).shuffle(
          seed=_seed(config.shuffle_seed, i)).repeat(None).map(
              lambda index, i=i: (i, index))
      for i, source in enumerate(sources)]
  mixed = streams[0] if len(streams) == 1 else grain.MapDataset.mix(
      streams, [c.weight for _, c in components])
  records = mixed[process_index::process_count].map(
      documents_lib.Loader(sources, encoders))
  fingerprint.update(shuffle_seed=config.shuffle_seed, rows=rows,
                     process_count=process_count)
  return Pipeline(
      _prefetched(_packed(config, records, sources, rows=rows,
                          drop_remainder=True), config.prefetch),
      fingerprint=fingerprint, model_keys=model_keys(config), elastic=False,
      process_index=process_index, process_count=process_count)


def _prefetched(dataset: grain.IterDataset, prefetch: int) -> grain.IterDataset:
  if not prefetch:
    return dataset
  return grain.experimental.ThreadPrefetchIterDataset(
      dataset, prefetch_buffer_size=prefetch)


def eval_batches(config: DataConfig, *, batch_size: int, vocab_size: int,
                 process_index: int = 0, process_count: int = 1,
                 image_inputs: images_lib.ImageInputs | None = None
                 ) -> Iterator[dict[str, np.ndarray]]:
  """The evaluation batches of this process: `data.eval_steps` of them.

  `data.eval_files` are read once in order (no shuffle), packed like the
  training data; a short last batch is padded with empty rows (mask 0), and
  when the files run out the remaining batches are empty, so that every
  process runs the same number of evaluation steps.
  """
  rows = _process_rows(batch_size, process_count)
  components = (("eval", MixtureComponent(
      source=config.eval_kind(), files=config.eval_files, weight=1.0)),)
  sources, encoders, _ = _encoders_and_sources(config, components,
                                               vocab_size=vocab_size,
                                               image_inputs=image_inputs)
  records = grain.MapDataset.range(len(sources[0])).map(
      lambda index: (0, index))[process_index::process_count].map(
          documents_lib.Loader(sources, encoders))
  batches = iter(_packed(config, records, sources, rows=rows,
                         drop_remainder=False))
  empty = None
  try:
    for _ in range(config.eval_steps):
      batch = next(batches, None)
      if batch is None:
        if empty is None:
          empty = _empty_batch(rows, config, image_inputs)
        batch = empty
      yield _pad_rows(batch, rows)
  finally:
    batches.close()


def _empty_batch(rows: int, config: DataConfig,
                 image_inputs: images_lib.ImageInputs | None
                 ) -> dict[str, np.ndarray]:
  seq_len = config.seq_len
  batch = {key: np.zeros((rows, seq_len), np.int32) for key in MODEL_KEYS}
  batch["record_ids"] = np.full((rows, seq_len), packing_lib.NO_RECORD,
                                np.int64)
  if config.images_per_row:
    settings = image_inputs.settings
    batch[packing_lib.IMAGES] = np.zeros(
        (rows, config.images_per_row, settings.height, settings.width, 3),
        np.float32)
  return batch


def _pad_rows(batch: dict[str, np.ndarray],
              rows: int) -> dict[str, np.ndarray]:
  missing = rows - len(batch["inputs"])
  if not missing:
    return batch
  fill = {k: (packing_lib.NO_RECORD if k == "record_ids" else 0)
          for k in batch}
  return {k: np.concatenate([v, np.full((missing, *v.shape[1:]), fill[k],
                                        v.dtype)]) for k, v in batch.items()}
