"""A job's inputs as batches of columns: one Python object per batch, not one per input.

The pipeline's reader cuts every shard into batches of ``batch_size`` usable inputs. Image shards come
as :class:`~clip_flash.jobs.items.Item` objects, whose cost is nothing beside an image's decoding. A
caption costs a few microseconds to embed, and all of the job's threads share one GIL: an object per
caption, made and read again in Python, held the GIL as long as the device step's launches needed it
(262,144 ``Item`` objects took 1.0 s). So a caption file's shard hands its rows over as lists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

Failure = Tuple[str, str]  # (the input's name in the failures file, why it was not embedded)


class RowIds(Sequence):
    """The ids of caption rows, made only when one is asked for: the input's own ``id`` column where it has
    one, else ``file:N`` (N counts from 1: the line of a ``.txt``, the data row of a CSV or parquet file)."""

    def __init__(self, location: str, rows: Sequence[int], ids: Optional[Sequence[str]] = None) -> None:
        self.location = location
        self.rows = rows                        # 0-based rows of the file
        self.ids = ids

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> str:  # type: ignore[override] - rows are named one at a time
        row = self.rows[index]
        return self.ids[row] if self.ids is not None else f"{self.location}:{row + 1}"


    def to_arrow(self) -> Any:
        """The ids as a pyarrow string array, made in bulk (by the writer thread, off the device loop)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(self.rows, range):
            rows = np.arange(self.rows.start, self.rows.stop, self.rows.step, dtype=np.int64)
        else:
            rows = np.asarray(self.rows, dtype=np.int64)
        if self.ids is not None:
            return pa.array([self.ids[row] for row in rows.tolist()], type=pa.string())
        return pc.binary_join_element_wise(f"{self.location}:", pc.cast(pa.array(rows + 1), pa.string()), "")


class LazyColumn:
    """A metadata column kept as its batches' :class:`RowIds` until the shard is written: a text job's ids cost
    the device loop nothing (1M ``file:N`` strings made one by one took over a second of its time)."""

    def __init__(self) -> None:
        self.parts: List[RowIds] = []

    def extend(self, part: RowIds) -> None:
        self.parts.append(part)

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            yield from part

    def to_arrow(self) -> Any:
        import pyarrow as pa

        if not self.parts:
            return pa.array([], type=pa.string())
        return pa.concat_arrays([part.to_arrow() for part in self.parts])


EMPTY_CAPTION = "empty caption"


@dataclass
class ItemBatch:
    """Usable inputs of one batch, as parallel columns (``None``: the job has no such column)."""

    paths: Sequence[str]                        # the metadata's ``image_path``; failures are named by it
    images: Optional[List[Any]] = None          # file paths or encoded bytes, for the image preparer
    captions: Optional[List[str]] = None
    keys: Optional[List[Optional[str]]] = None  # WebDataset ``__key__``

    def __len__(self) -> int:
        return len(self.paths)

    @classmethod
    def from_items(cls, items: Sequence[Any]) -> "ItemBatch":
        """The columns of :class:`~clip_flash.jobs.items.Item` objects."""
        return cls(paths=[item.path for item in items], images=[item.image for item in items],
                   captions=[item.caption for item in items], keys=[item.key for item in items])

    def select(self, rows: Sequence[int]) -> "ItemBatch":
        """These rows only, in the order given (the inputs whose image was prepared)."""
        if len(rows) == len(self):
            return self

        def pick(column: Optional[Sequence[Any]]) -> Optional[List[Any]]:
            return None if column is None else [column[row] for row in rows]

        return ItemBatch(pick(self.paths), pick(self.images), pick(self.captions), pick(self.keys))


def batches_from_items(items: Iterable[Any], batch_size: int) -> Iterator[Tuple[Optional[ItemBatch], List[Failure]]]:
    """Group ``Item`` objects into batches of ``batch_size`` usable ones; each comes with the items known to
    be unusable (``item.error``) that were read since the previous batch. The last batch may be ``None``."""
    batch: List[Any] = []
    failures: List[Failure] = []
    for item in items:
        if item.error is not None:
            failures.append((item.path, item.error))
            continue
        batch.append(item)
        if len(batch) == batch_size:
            yield ItemBatch.from_items(batch), failures
            batch, failures = [], []
    if batch or failures:
        yield (ItemBatch.from_items(batch) if batch else None), failures


def caption_batches(location: str, start: int, captions: List[Optional[str]], batch_size: int,
                    ids: Optional[Sequence[str]] = None, reasons: Optional[Dict[int, str]] = None
                    ) -> Iterator[Tuple[Optional[ItemBatch], List[Failure]]]:
    """A caption shard (rows ``start``, ``start + 1``, ... of ``location``) in batches: lists sliced from the
    shard's captions; a ``None`` caption is a failure named by its row id, for ``reasons[row]`` (default: an
    empty caption)."""
    reasons = reasons or {}
    for first in range(0, len(captions), batch_size):
        chunk = captions[first:first + batch_size]
        rows: Sequence[int] = range(start + first, start + first + len(chunk))
        failures: List[Failure] = []
        if None in chunk:  # rare (blank lines, null cells): drop those rows
            names = RowIds(location, rows, ids)
            failures = [(names[position], reasons.get(row, EMPTY_CAPTION))
                        for position, (row, text) in enumerate(zip(rows, chunk)) if text is None]
            rows = [row for row, text in zip(rows, chunk) if text is not None]
            chunk = [text for text in chunk if text is not None]
        yield (ItemBatch(RowIds(location, rows, ids), captions=chunk) if chunk else None), failures


def shard_batches(shard: Any, batch_size: int) -> Iterator[Tuple[Optional[ItemBatch], List[Failure]]]:
    """A shard's batches: its own ``load_batches`` where it has one (caption files), else its items grouped."""
    if shard.load_batches is not None:
        return shard.load_batches(batch_size)
    return batches_from_items(shard.load(), batch_size)
