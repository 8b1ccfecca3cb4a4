"""What an embedding job reads: an image folder, WebDataset tar shards, or a file of captions.

Every source is cut into a fixed plan of numbered shards before anything is embedded, so a restarted
job finds the same shards under the same numbers and skips the finished ones:

- image folder: every image below the folder (recursive, sorted by relative path), ``shard_size``
  items per shard; ``a/b.txt`` beside ``a/b.jpg`` is its caption, as clip-retrieval reads it;
- WebDataset: one output shard per input tar (in the order given), its samples in tar order;
- captions: one per line of a ``.txt``, or a column of a ``.csv``/``.tsv``/``.parquet``, ``shard_size``
  rows per shard, in file order.

A shard's ``fingerprint`` names exactly which inputs it holds; the writer stores it with the finished
shard, so inputs that changed between two runs are caught rather than embedded twice or not at all.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

from .batches import Failure, ItemBatch, caption_batches

logger = logging.getLogger(__name__)

# clip-retrieval's image suffixes (it globs both cases); matched case-insensitively here.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
CAPTION_FILE_SUFFIXES = (".txt", ".csv", ".tsv", ".parquet")
CAPTION_COLUMN_GUESSES = ("caption", "text", "captions", "txt")
# WebDataset members: the image is the first of these suffixes a sample has, the caption its "txt"
# (or a "caption"/"text" field of its "json").
WDS_IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp")


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


class Source:
    """Base of the three sources: ``kind``, which modalities it has, and its shard plan."""

    kind = "source"

    def __init__(self, location: str, has_images: bool, has_captions: bool, repeat: int = 1) -> None:
        self.location = location
        self.has_images = has_images
        self.has_captions = has_captions
        self.repeat = repeat

    def shards(self) -> List[Shard]:
        raise NotImplementedError

    def settings(self) -> dict:
        """What of the source decides the output (kept in the job's settings file)."""
        return {"kind": self.kind, "location": self.location, "images": self.has_images,
                "captions": self.has_captions, "repeat": self.repeat}


def _digest(parts: Sequence[str]) -> str:
    hasher = hashlib.sha1()
    for part in parts:
        hasher.update(part.encode("utf-8", "surrogatepass"))
        hasher.update(b"\0")
    return hasher.hexdigest()


def _chunks(count: int, size: int) -> Iterator[range]:
    for start in range(0, count, size):
        yield range(start, min(start + size, count))


# ----- image folder --------------------------------------------------------------------------
def load_folder_items(paths: List[str], captions: bool) -> Iterator[Item]:
    """A folder shard's items: each image path, with its caption read when the job has captions."""
    for path in paths:
        caption, error = None, None
        if captions:
            caption_path = Path(path).with_suffix(".txt")
            try:
                caption = caption_path.read_text(encoding="utf-8")
            except FileNotFoundError:
                error = f"no caption file {caption_path.name} beside the image"
            except (OSError, UnicodeDecodeError) as failure:
                error = f"cannot read caption {caption_path.name}: {failure}"
        yield Item(path=path, image=path, caption=caption, error=error)


class FolderSource(Source):
    """Images below a folder, recursively, sorted by their path relative to it."""

    kind = "folder"

    def __init__(self, folder: Path, shard_size: int, captions: Optional[bool] = None, repeat: int = 1) -> None:
        folder = Path(folder).resolve()
        images = sorted((path for path in folder.rglob("*")
                         if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()),
                        key=lambda path: path.relative_to(folder).as_posix())
        if not images:
            raise SourceError(f"no images ({', '.join(IMAGE_SUFFIXES)}) found below {folder}")
        if captions is None:  # auto: captions when any image has its .txt beside it
            captions = any(path.with_suffix(".txt").is_file() for path in images)
        super().__init__(str(folder), has_images=True, has_captions=captions, repeat=repeat)
        self.images = images * repeat  # repeat: a benchmark's way to a steady state on a small folder
        self.shard_size = shard_size

    def settings(self) -> dict:
        return {**super().settings(), "shard_size": self.shard_size}

    def shards(self) -> List[Shard]:
        plan = []
        for index, rows in enumerate(_chunks(len(self.images), self.shard_size)):
            paths = self.images[rows.start:rows.stop]
            plan.append(Shard(
                index=index, fingerprint=_digest([str(path) for path in paths]),
                description=f"images {rows.start}..{rows.stop - 1} of {self.location}", size=len(paths),
                load=functools.partial(load_folder_items, [str(path) for path in paths], self.has_captions)))
        return plan


# ----- WebDataset tar shards -----------------------------------------------------------------
_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> List[str]:
    """``a{00..02}.tar`` -> a00.tar a01.tar a02.tar, ``{x,y}`` -> x y (the WebDataset URL spelling).

    A numeric range keeps the zero padding of its first bound.
    """
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[:match.start()], match.group(1), pattern[match.end():]
    numeric = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numeric:
        first, last = numeric.groups()
        width = len(first) if first.startswith("0") else 0
        options = [str(number).zfill(width) for number in range(int(first), int(last) + 1)]
    else:
        options = body.split(",")
    return [expanded for option in options for expanded in expand_braces(head + option + tail)]


def _split_member_name(name: str):
    """WebDataset's rule: the key is the path up to the first dot of the file name, the rest its field."""
    directory, _, base = name.rpartition("/")
    stem, dot, field = base.partition(".")
    if not dot:
        return None
    return (directory + "/" + stem if directory else stem), field.lower()


def _caption_from_json(data: bytes) -> Optional[str]:
    import json

    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if isinstance(record, dict):
        for field in ("caption", "text"):
            if isinstance(record.get(field), str):
                return record[field]
    return None


def tar_samples(tar_path: str) -> Iterator[dict]:
    """Samples as dicts of field -> bytes with ``__key__``; a read error ends the tar with ``__error__``."""
    sample: dict = {}
    try:
        with tarfile.open(tar_path, mode="r|*") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                split = _split_member_name(member.name)
                if split is None:
                    continue
                key, field = split
                if sample and sample["__key__"] != key:
                    yield sample
                    sample = {}
                sample.setdefault("__key__", key)
                sample[field] = archive.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as error:
        # the sample being read may be incomplete: it is reported with the rest of the tar, not embedded
        yield {"__error__": f"tar read error in {os.path.basename(tar_path)} at key "
                            f"{sample.get('__key__', '(start)')!r}; it and any later samples not read: {error}"}
        return
    if sample:
        yield sample


def load_tar_items(tar_path: str, captions: bool) -> Iterator[Item]:
    """A tar's items, one per sample, in tar order."""
    for sample in tar_samples(tar_path):
        if "__error__" in sample:
            yield Item(path=tar_path, error=sample["__error__"])
            continue
        key = sample["__key__"]
        image = next((sample[field] for field in WDS_IMAGE_SUFFIXES if field in sample), None)
        caption, error = None, None
        if captions:
            if "txt" in sample:
                try:
                    caption = sample["txt"].decode("utf-8")
                except UnicodeDecodeError as failure:
                    error = f"caption is not UTF-8: {failure}"
            else:
                caption = _caption_from_json(sample.get("json", b""))
                if caption is None:
                    error = "sample has no caption (.txt or json caption)"
        if image is None:
            error = f"sample has no image ({'/'.join(WDS_IMAGE_SUFFIXES)})"
        yield Item(path=key, image=image, caption=caption, key=key, error=error)


class WebDatasetSource(Source):
    """Tar shards in the WebDataset layout: members grouped into samples by key, in tar order."""

    kind = "webdataset"

    def __init__(self, tars: Sequence[str], captions: Optional[bool] = None, repeat: int = 1) -> None:
        missing = [tar for tar in tars if not os.path.isfile(tar)]
        if missing:
            raise SourceError(f"{len(missing)} tar file(s) not found, first {missing[0]}")
        if not tars:
            raise SourceError("no tar files given")
        unique = [str(Path(tar).resolve()) for tar in tars]
        self.tars = unique
        if captions is None:
            captions = self._first_sample_has_caption()
        super().__init__(",".join(unique), has_images=True, has_captions=captions, repeat=repeat)
        self.tars = unique * repeat

    def _first_sample_has_caption(self) -> bool:
        for sample in tar_samples(self.tars[0]):
            return "txt" in sample or _caption_from_json(sample.get("json", b"")) is not None
        return False

    def shards(self) -> List[Shard]:
        plan = []
        for index, tar in enumerate(self.tars):
            stat = os.stat(tar)
            plan.append(Shard(index=index, fingerprint=_digest([tar, str(stat.st_size)]), description=f"tar {tar}",
                              size=None, load=functools.partial(load_tar_items, tar, self.has_captions)))
        return plan


# ----- caption files -------------------------------------------------------------------------
def _pick_column(columns: Sequence[str], wanted: Optional[str], path: Path) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise SourceError(f"{path} has no column {wanted!r} (columns: {', '.join(columns)})")
        return wanted
    for guess in CAPTION_COLUMN_GUESSES:
        if guess in columns:
            return guess
    if len(columns) == 1:
        return columns[0]
    raise SourceError(f"{path}: which column holds the captions? Pass --caption-column "
                      f"(columns: {', '.join(columns)})")


def read_captions(path: Path, column: Optional[str] = None) -> List[Optional[str]]:
    """Every caption of a text (one per line), CSV/TSV (with a header) or parquet file, in order."""
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return path.read_text(encoding="utf-8").splitlines()
    if suffix in (".csv", ".tsv"):
        import pyarrow.csv as pa_csv

        table = pa_csv.read_csv(str(path), parse_options=pa_csv.ParseOptions(
            delimiter="\t" if suffix == ".tsv" else ",", newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(strings_can_be_null=False))
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(str(path))
    else:
        raise SourceError(f"{path}: a caption file must end in {', '.join(CAPTION_FILE_SUFFIXES)}")
    name = _pick_column(table.column_names, column, path)
    values = table.column(name).to_pylist()
    return [value if value is None or isinstance(value, str) else str(value) for value in values]


def load_caption_items(location: str, start: int, captions: List[Optional[str]]) -> Iterator[Item]:
    """A caption shard's items; ``path`` is ``file:row`` (failures name the row)."""
    for row, caption in enumerate(captions, start):
        yield Item(path=f"{location}:{row}", caption=caption,
                   error="empty (null) caption" if caption is None else None)


class CaptionFileSource(Source):
    """A text-only job: the captions of one file, ``shard_size`` rows per shard."""

    kind = "captions"

    def __init__(self, path: Path, shard_size: int, column: Optional[str] = None, repeat: int = 1) -> None:
        path = Path(path).resolve()
        self.captions = read_captions(path, column) * repeat
        if not self.captions:
            raise SourceError(f"{path} holds no captions")
        super().__init__(str(path), has_images=False, has_captions=True, repeat=repeat)
        self.column = column
        self.shard_size = shard_size

    def settings(self) -> dict:
        return {**super().settings(), "column": self.column, "shard_size": self.shard_size}

    def shards(self) -> List[Shard]:
        plan = []
        for index, rows in enumerate(_chunks(len(self.captions), self.shard_size)):
            captions = self.captions[rows.start:rows.stop]
            plan.append(Shard(index=index,
                              fingerprint=_digest([self.location, str(rows.start)] + [text or "" for text in captions]),
                              description=f"captions {rows.start}..{rows.stop - 1} of {self.location}",
                              size=len(rows), load=functools.partial(load_caption_items, self.location, rows.start,
                                                                     captions),
                              load_batches=functools.partial(caption_batches, self.location, rows.start, captions)))
        return plan


# ----- which source ---------------------------------------------------------------------------
def open_source(location: Union[str, Path], shard_size: int, captions: Optional[bool] = None,
                caption_column: Optional[str] = None, repeat: int = 1) -> Source:
    """The source a path names: a folder of tars or images, tar file(s) (``{a..b}`` patterns too), or a
    caption file. ``captions=None`` reads captions when the input has them."""
    text = str(location)
    tars = expand_braces(text) if text.endswith(".tar") or "{" in text else []
    if tars:
        return WebDatasetSource(tars, captions, repeat)
    path = Path(text)
    if not path.exists():
        raise SourceError(f"input not found: {path}")
    if path.is_dir():
        folder_tars = sorted(str(tar) for tar in path.glob("*.tar"))
        has_images = any(child.suffix.lower() in IMAGE_SUFFIXES for child in path.rglob("*"))
        if folder_tars and not has_images:
            return WebDatasetSource(folder_tars, captions, repeat)
        return FolderSource(path, shard_size, captions, repeat)
    if path.suffix.lower() in CAPTION_FILE_SUFFIXES:
        if captions is False:
            raise SourceError(f"{path} is a caption file, but captions were turned off")
        return CaptionFileSource(path, shard_size, caption_column, repeat)
    raise SourceError(f"cannot tell what {path} is: give a folder of images, WebDataset .tar file(s), "
                      f"or a caption file ({', '.join(CAPTION_FILE_SUFFIXES)})")
