"""Records with several named fields, from any file format of the pipeline.

The pre-training pipeline reads one field per record (`data.text_field`);
prompt/completion columns and preference records (prompt, chosen, rejected)
need several. `read_rows(kind, files, fields)` reads them with the same
sources (`maxtext.data.sources`): JSONL and ArrayRecord records are JSON
objects; Parquet and Arrow get one column source per field.
"""

from collections.abc import Iterator, Sequence
import json
from typing import Any

from maxtext.data import sources as sources_lib


def read_rows(kind: str, files: str, fields: Sequence[str]
              ) -> Iterator[dict[str, Any]]:
  """{field: value} of every record of `files`, in order.

  Args:
    kind: A file format of `maxtext.data.sources.SOURCE_KINDS` except
      "text".
    files: Comma-separated glob patterns (folders for "arrow").
    fields: The fields to read.

  Raises:
    ValueError: the format has no named fields, or a record lacks a field
      or is not a JSON object (the message names the record).
    FileNotFoundError: a pattern matches nothing.
  """
  if kind == "text":
    raise ValueError("Plain text files have no named fields; use jsonl,"
                     " parquet, arrayrecord or arrow records.")
  def source(field):
    return sources_lib.make_file_source(kind, files, text_field=field,
                                        text_unit="line")

  first = source(fields[0])
  # JSON records hold every field; column formats need one source each.
  columns = [first, *map(source, fields[1:])] if first.payload == "value" \
      else [first]
  for index in range(len(first)):
    if first.payload == "value":
      yield {field: column[index] for field, column in zip(fields, columns)}
      continue
    raw = first[index]
    try:
      record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(f"Record {first.where(index)} is not JSON: {e}") from e
    except RecursionError:
      raise ValueError(f"Record {first.where(index)} is not JSON: nested"
                       " too deeply.") from None
    if not isinstance(record, dict):
      raise ValueError(f"Record {first.where(index)} is not a JSON object.")
    missing = [field for field in fields if field not in record]
    if missing:
      raise ValueError(f"Record {first.where(index)} has no field(s)"
                       f" {missing}; its fields: {sorted(record)}.")
    yield {field: record[field] for field in fields}
