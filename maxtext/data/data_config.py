"""The `data` config section: sources, mixture, tokenization and packing.

`DataConfig` is the typed, validated `data` section (its keys are documented
in `configs/common.py`), built through the config front door
(`maxtext.common.sections`). Training reads one source (`data.source` and
`data.files`) or a weighted mixture (`data.mixture`: names to
`MixtureComponent`s, stored as (name, component) pairs sorted by name once
validated); evaluation reads `data.eval_files`. File patterns, the tokenizer
and the chat template are resolved as the user meant them (`paths`).

The input pipeline that reads the data it describes is
`maxtext.data.pipeline`.
"""

from collections.abc import Mapping
import dataclasses
from typing import Any

from maxtext.common import paths
from maxtext.common import sections
from maxtext.data import assets
from maxtext.data import chat_template as chat_lib
from maxtext.data import packing as packing_lib
from maxtext.data import sources as sources_lib

SOURCES = (*sources_lib.SOURCE_KINDS, "synthetic", "mixture")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixtureComponent:
  """One source of `data.mixture`.

  Attributes:
    source: A file format of `maxtext.data.sources.SOURCE_KINDS`.
    files: Comma-separated glob patterns (folders for "arrow").
    weight: Share of the mixture (normalised over the components).
    text_field: Field with the text; empty means `data.text_field`.
  """

  source: str
  files: str = paths.field(paths.user_patterns)
  weight: float
  text_field: str = ""


def _user_mixture(mixture: Any) -> Any:
  """`data.mixture` with each component's files resolved as the user meant
  them (`paths`); a malformed mixture is left to `DataConfig`'s check."""
  if not isinstance(mixture, Mapping):
    return mixture
  return {name: paths.resolve_values(MixtureComponent, values)
          if isinstance(values, Mapping) else values
          for name, values in mixture.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """The `data` config section (documented in `configs/common.py`)."""

  source: str
  files: str = paths.field(paths.user_patterns)
  text_field: str
  text_unit: str
  mixture: Any = paths.field(_user_mixture)
  tokenizer: str = paths.field()
  add_bos: bool
  add_eos: bool
  chat_template: str = paths.field(chat_lib.user_template)
  packing: str
  images_per_row: int = 0
  image_dir: str = paths.field(default="")
  image_field: str = ""
  seq_len: int
  shuffle_seed: int
  num_workers: int
  prefetch: int
  strict: bool
  max_document_bytes: int
  eval_source: str
  eval_files: str = paths.field(paths.user_patterns)
  eval_every_steps: int
  eval_steps: int

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(
          f"data.source={self.source!r} is invalid; valid sources: {SOURCES}.")
    for name in ("seq_len", "max_document_bytes"):
      sections.check_int(f"data.{name}", getattr(self, name), minimum=1)
    for name in ("num_workers", "prefetch", "eval_every_steps",
                 "images_per_row"):
      sections.check_int(f"data.{name}", getattr(self, name), minimum=0)
    sections.check_int("data.eval_steps", self.eval_steps, minimum=1)
    if not 0 <= self.shuffle_seed < 2**32:
      raise ValueError(
          f"data.shuffle_seed={self.shuffle_seed!r} must be in [0, 2**32).")
    if self.packing not in packing_lib.PACKINGS:
      raise ValueError(f"data.packing={self.packing!r} is invalid; valid:"
                       f" {packing_lib.PACKINGS}.")
    if self.images_per_row and self.packing == "concat":
      raise ValueError(
          f"data.packing='concat' cuts documents at row boundaries, which "
          f"would split images; with data.images_per_row="
          f"{self.images_per_row} use 'first_fit' or 'none'.")
    if self.image_field and not self.images_per_row:
      raise ValueError(
          f"data.image_field={self.image_field!r} needs image slots "
          "(data.images_per_row > 0).")
    if self.images_per_row and not self.chat_template:
      raise ValueError(
          f"data.images_per_row={self.images_per_row} needs chat records "
          "(data.chat_template): their image parts are the images.")
    if self.text_unit not in sources_lib.TEXT_UNITS:
      raise ValueError(f"data.text_unit={self.text_unit!r} is invalid; valid:"
                       f" {sources_lib.TEXT_UNITS}.")
    components = tuple(_mixture_components(self.mixture))
    object.__setattr__(self, "mixture", components)
    if self.source == "mixture" and not components:
      raise ValueError("data.source='mixture' needs components in"
                       " data.mixture: {name: {source, files, weight}}.")
    if self.source not in ("text", "synthetic", "mixture") and not self.files:
      raise ValueError(f"data.source={self.source!r} needs data.files.")
    if self.eval_every_steps:
      if not self.eval_files:
        raise ValueError("data.eval_every_steps > 0 needs data.eval_files.")
      if self.eval_kind() not in sources_lib.SOURCE_KINDS:
        raise ValueError(
            f"Evaluation reads data.eval_files as data.eval_source, or as"
            f" data.source when that is empty; got {self.eval_kind()!r},"
            f" valid: {sources_lib.SOURCE_KINDS}.")

  def eval_kind(self) -> str:
    """The file format of `eval_files`."""
    return self.eval_source or self.source

  def components(self) -> tuple[tuple[str, MixtureComponent], ...]:
    """(name, component) of every training source; one unless mixed."""
    if self.source == "mixture":
      return self.mixture
    files = self.files
    if self.source == "text" and not files:
      files = ",".join(assets.default_text_files())
    return (("data", MixtureComponent(source=self.source, files=files,
                                      weight=1.0)),)


def _mixture_components(mixture: Any):
  if not isinstance(mixture, Mapping):
    raise ValueError(
        f"data.mixture must map names to components, got {mixture!r}.")
  for name, values in sorted(mixture.items()):
    if isinstance(values, MixtureComponent):
      component = values
    else:
      fields = [f.name for f in dataclasses.fields(MixtureComponent)]
      unknown = sorted(set(values) - set(fields))
      if unknown:
        raise ValueError(f"Unknown key(s) {unknown} in data.mixture.{name};"
                         f" valid keys: {fields}.")
      component = MixtureComponent(**values)
    if component.source not in sources_lib.SOURCE_KINDS:
      raise ValueError(
          f"data.mixture.{name}.source={component.source!r} is invalid;"
          f" valid: {sources_lib.SOURCE_KINDS}.")
    if not component.weight > 0:
      raise ValueError(
          f"data.mixture.{name}.weight={component.weight!r} must be > 0.")
    yield name, component
