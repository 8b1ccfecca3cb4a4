"""A file of captions as a job's input (a text-only job): one caption per line of a ``.txt``, or a column of a
``.csv``/``.tsv``/``.parquet``, ``shard_size`` rows per shard, in file order.

Rules, the same for every format:

- a ``.txt`` is split at line ends only (``\\n`` or ``\\r\\n``; other Unicode line separators stay inside
  the caption), a leading UTF-8 BOM is dropped, and a line that is not UTF-8 is that row's failure;
- a blank or whitespace-only caption and a null cell are failures with reason ``empty caption``;
- every row keeps an id: the file's ``id`` column where it has one, else ``file:N`` (N from 1: the line of a
  ``.txt``, the data row of a CSV/parquet file). The metadata's ``id`` column and ``failures.parquet`` use it,
  so rows join back to the input after failures;
- a column of bytes is refused: captions are text.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from .batches import EMPTY_CAPTION, RowIds, caption_batches
from .items import Item, Shard, Source, SourceError, chunks, digest, file_stamp

logger = logging.getLogger(__name__)

CAPTION_FILE_SUFFIXES = (".txt", ".csv", ".tsv", ".parquet")
CAPTION_COLUMN_GUESSES = ("caption", "text", "captions", "txt")
ID_COLUMN = "id"
UTF8_BOM = "\ufeff"


@dataclass
class CaptionTable:
    """A caption file read: ``captions[row]`` (None: a failure, for ``reasons.get(row, EMPTY_CAPTION)``), the
    file's own ids (None: ``file:N``), and which column held the captions."""

    captions: List[Optional[str]]
    reasons: Dict[int, str] = field(default_factory=dict)
    ids: Optional[List[str]] = None
    column: Optional[str] = None


def _pick_column(columns: Sequence[str], wanted: Optional[str], path: Path) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise SourceError(f"{path} has no column {wanted!r} (columns: {', '.join(columns)})")
        return wanted
    for guess in CAPTION_COLUMN_GUESSES:
        if guess in columns:
            return guess
    text_columns = [name for name in columns if name != ID_COLUMN]
    if len(text_columns) == 1:
        return text_columns[0]
    raise SourceError(f"{path}: which column holds the captions? Pass --caption-column "
                      f"(columns: {', '.join(columns)})")


def _text_lines(path: Path) -> CaptionTable:
    data = path.read_bytes()
    reasons: Dict[int, str] = {}
    try:
        text = data.decode("utf-8")
        lines: List[Optional[str]] = text.split("\n")
    except UnicodeDecodeError:
        lines = []
        for row, raw in enumerate(data.split(b"\n")):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                lines.append(None)
                reasons[row] = f"line {row + 1} of {path.name} is not UTF-8 (byte {error.start} of the line)"
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line
    if lines and lines[0] is not None and lines[0].startswith(UTF8_BOM):
        lines[0] = lines[0][1:]
    if any(line is not None and line.endswith("\r") for line in lines):
        lines = [line[:-1] if line is not None and line.endswith("\r") else line for line in lines]
    return CaptionTable(lines, reasons)


def _table_column(path: Path, column: Optional[str]) -> CaptionTable:
    import pyarrow as pa

    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        import pyarrow.csv as pa_csv

        table = pa_csv.read_csv(str(path), parse_options=pa_csv.ParseOptions(
            delimiter="\t" if suffix == ".tsv" else ",", newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(strings_can_be_null=False))
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(str(path))
    name = _pick_column(table.column_names, column, path)
    array = table.column(name)
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type) \
            or pa.types.is_fixed_size_binary(array.type):
        raise SourceError(f"column {name!r} of {path} holds bytes ({array.type}), not text: store the captions "
                          "as strings (decode them, e.g. with pyarrow.compute.cast(column, pyarrow.string()))")
    values = array.to_pylist()
    captions = [value if value is None or isinstance(value, str) else str(value) for value in values]
    ids = None
    if ID_COLUMN in table.column_names and ID_COLUMN != name:
        ids = [str(value) for value in table.column(ID_COLUMN).to_pylist()]
    return CaptionTable(captions, ids=ids, column=name)


def read_captions(path: Path, column: Optional[str] = None) -> CaptionTable:
    """Every caption of a text (one per line), CSV/TSV (with a header) or parquet file, in order; blank ones
    and nulls are None (failures)."""
    suffix = path.suffix.lower()
    if suffix == ".txt":  # one caption per line: no columns (a column asked for is ignored)
        table = _text_lines(path)
    elif suffix in (".csv", ".tsv", ".parquet"):
        table = _table_column(path, column)
    else:
        raise SourceError(f"{path}: a caption file must end in {', '.join(CAPTION_FILE_SUFFIXES)}")
    captions = table.captions
    for row, caption in enumerate(captions):
        if caption is not None and (not caption or caption.isspace()):
            captions[row] = None
    return table


def load_caption_items(location: str, start: int, captions: List[Optional[str]],
                       ids: Optional[Sequence[str]] = None, reasons: Optional[Dict[int, str]] = None
                       ) -> Iterator[Item]:
    """A caption shard's items, named by their row ids (failures name the row)."""
    names = RowIds(location, range(start, start + len(captions)), ids)
    reasons = reasons or {}
    for position, caption in enumerate(captions):
        yield Item(path=names[position], caption=caption,
                   error=reasons.get(start + position, EMPTY_CAPTION) if caption is None else None)


class CaptionFileSource(Source):
    """A text-only job: the captions of one file, ``shard_size`` rows per shard."""

    kind = "captions"

    def __init__(self, path: Path, shard_size: int, column: Optional[str] = None, repeat: int = 1) -> None:
        path = Path(path).resolve()
        ignored = []
        if path.suffix.lower() == ".txt" and column is not None:
            ignored.append(f"caption column {column!r} ignored: {path.name} holds one caption per line")
            column = None
        table = read_captions(path, column)
        self.captions = table.captions * repeat
        if not self.captions:
            raise SourceError(f"{path} holds no captions")
        super().__init__(str(path), has_images=False, has_captions=True, repeat=repeat)
        self.notes.extend(ignored)
        count = len(table.captions)
        self.ids = None if table.ids is None else table.ids * repeat
        self.reasons = {row + copy * count: reason for copy in range(repeat) for row, reason in table.reasons.items()}
        self.column = column
        self.stamp = file_stamp(str(path))
        self.shard_size = shard_size

    def settings(self) -> dict:
        return {**super().settings(), "column": self.column, "shard_size": self.shard_size}

    def shards(self) -> List[Shard]:
        plan = []
        for index, rows in enumerate(chunks(len(self.captions), self.shard_size)):
            captions = self.captions[rows.start:rows.stop]
            reasons = {row: reason for row, reason in self.reasons.items() if row in rows}
            ids = self.ids
            plan.append(Shard(
                index=index,
                fingerprint=digest([self.location, str(rows.start)] + [text or "" for text in captions]
                                   + ([] if ids is None else ids[rows.start:rows.stop])),
                description=f"captions {rows.start + 1}..{rows.stop} of {self.location}", size=len(rows),
                load=functools.partial(load_caption_items, self.location, rows.start, captions, ids, reasons),
                load_batches=functools.partial(self._batches, rows.start, captions, reasons),
                inputs=[(self.location, self.stamp)]))
        return plan

    def _batches(self, start: int, captions: List[Optional[str]], reasons: Dict[int, str], batch_size: int):
        return caption_batches(self.location, start, captions, batch_size, self.ids, reasons)
