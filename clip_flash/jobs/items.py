"""The pieces every job source is made of: one input (:class:`Item`), one numbered shard (:class:`Shard`),
the :class:`Source` base, and how inputs are identified between two runs (:func:`file_stamp`).

A shard's ``inputs`` name what its rows depend on, each with a stamp (a file's size and modification
time, or a digest of its text): the writer keeps them with the finished shard, so a resumed job that
finds another stamp refuses the folder and names the input that changed.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

from .batches import Failure, ItemBatch


class SourceError(Exception):
    """The input cannot be read as any source (missing, empty, or of an unknown kind)."""


@dataclass(frozen=True)
class Item:
    """One input: what the image preparer reads, its caption, and the names the metadata keeps.

    ``error`` is set when the item is already known to be unusable (a caption file that cannot be
    read, a sample with no image): it goes to the failures file and is never embedded.
    """

    path: str                                   # the metadata's ``image_path`` (file path or WebDataset key)
    image: Union[str, bytes, None] = None       # a file path or the encoded bytes
    caption: Optional[str] = None
    key: Optional[str] = None                   # the WebDataset ``__key__``
    error: Optional[str] = None


@dataclass(frozen=True)
class Shard:
    """One numbered output shard: how to read its items and what identifies them."""

    index: int
    fingerprint: str
    description: str
    size: Optional[int]                         # items, when known before reading (not for tars)
    load: Callable[[], Iterator[Item]]
    # The shard as batches of columns (``batch_size`` -> (batch, failures) pairs), where it can do better than
    # grouping ``load()``'s items: see :mod:`clip_flash.jobs.batches`.
    load_batches: Optional[Callable[[int], Iterator[Tuple[Optional[ItemBatch], List[Failure]]]]] = None
    # (input, stamp) pairs the rows depend on; the fingerprint is their digest. Kept with the finished shard so
    # that a resumed job can say which input changed.
    inputs: List[Tuple[str, str]] = field(default_factory=list, repr=False, compare=False)


class Source:
    """Base of the three sources: ``kind``, which modalities it has, and its shard plan."""

    kind = "source"

    def __init__(self, location: str, has_images: bool, has_captions: bool, repeat: int = 1) -> None:
        self.location = location
        self.has_images = has_images
        self.has_captions = has_captions
        self.repeat = repeat
        self.notes: List[str] = []              # what the source ignored or skipped, said once by the job

    def shards(self) -> List[Shard]:
        raise NotImplementedError

    def settings(self) -> dict:
        """What of the source decides the output (kept in the job's settings file)."""
        return {"kind": self.kind, "location": self.location, "images": self.has_images,
                "captions": self.has_captions, "repeat": self.repeat}


def digest(parts: Sequence[str]) -> str:
    hasher = hashlib.sha1()
    for part in parts:
        hasher.update(part.encode("utf-8", "surrogatepass"))
        hasher.update(b"\0")
    return hasher.hexdigest()


def stamp_of(stat: os.stat_result) -> str:
    """A file's identity between two runs: its size and modification time (an edit in place changes one)."""
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def file_stamp(path: str) -> str:
    return stamp_of(os.stat(path))


def fingerprint_of(inputs: Sequence[Tuple[str, str]]) -> str:
    return digest([part for pair in inputs for part in pair])


def chunks(count: int, size: int) -> Iterator[range]:
    for start in range(0, count, size):
        yield range(start, min(start + size, count))
