"""An image folder as a job's input: every image below it (recursive, sorted by relative path), with the
caption ``x.txt`` beside ``x.jpg`` where there is one, as clip-retrieval reads it.

Captions are read where they exist: an image without a ``.txt`` gets an empty caption (``require_captions``
makes it a failure instead). Only regular files are read (a FIFO named ``x.txt`` would block the job).
"""
from __future__ import annotations

import functools
import logging
import os
import stat as stat_module
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from .items import Item, Shard, Source, SourceError, chunks, fingerprint_of, stamp_of

logger = logging.getLogger(__name__)

# clip-retrieval's image suffixes (it globs both cases); matched case-insensitively here.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
UTF8_BOM = b"\xef\xbb\xbf"
NOT_A_FILE_KINDS = ((stat_module.S_ISFIFO, "a FIFO"), (stat_module.S_ISSOCK, "a socket"),
                    (stat_module.S_ISCHR, "a character device"), (stat_module.S_ISBLK, "a block device"),
                    (stat_module.S_ISDIR, "a folder"))


@dataclass(frozen=True)
class FolderImage:
    """One image of the plan: its path, its stamp, and its caption file (None: none beside it)."""

    path: str
    stamp: str
    caption_path: Optional[str] = None
    caption_stamp: Optional[str] = None


def _kind_of(mode: int) -> str:
    return next((name for test, name in NOT_A_FILE_KINDS if test(mode)), "not a regular file")


def walk_folder(folder: str) -> Tuple[List[Tuple[str, os.stat_result]], Dict[str, Tuple[str, os.stat_result]],
                                     List[str]]:
    """Every image file below ``folder`` (path, stat), the ``.txt`` files by path without suffix, and the
    dangling symlinks met. Symlinked folders are not followed (no loops); symlinked files are."""
    images, texts, dangling = [], {}, []
    pending = [folder]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as error:
            logger.warning("cannot list %s (%s): its files are not embedded", directory, error)
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
                continue
            stem, suffix = os.path.splitext(entry.path)
            suffix = suffix.lower()
            if suffix not in IMAGE_SUFFIXES and suffix != ".txt":
                continue
            try:
                status = entry.stat()  # follows a symlink
            except FileNotFoundError:
                dangling.append(entry.path)
                continue
            except OSError:
                continue
            if suffix == ".txt":
                texts[stem] = (entry.path, status)
            elif stat_module.S_ISREG(status.st_mode):
                images.append((entry.path, status))
    return images, texts, dangling


def read_caption_file(path: str) -> Tuple[Optional[str], Optional[str]]:
    """(caption, None) or (None, why not): a regular file's UTF-8 text, a leading BOM removed. Opened without
    blocking and checked after opening, so a FIFO or device never stalls the job."""
    name = os.path.basename(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        return None, f"cannot read caption {name}: {error.strerror or error}"
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat_module.S_ISREG(mode):
            return None, f"caption {name} is {_kind_of(mode)}, not a regular file: not read"
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            data = handle.read()
    except OSError as error:
        return None, f"cannot read caption {name}: {error.strerror or error}"
    finally:
        os.close(descriptor)
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        return None, (f"caption {name} is not UTF-8: line {line}, byte {error.start} "
                      f"({data[error.start:error.start + 1]!r})")


def load_folder_items(images: List[FolderImage], captions: bool, require_captions: bool) -> Iterator[Item]:
    """A folder shard's items: each image path, with its caption when the job reads captions."""
    for image in images:
        caption, error = None, None
        if captions:
            if image.caption_path is None:
                caption = ""
                if require_captions:
                    error = f"no caption file {Path(image.path).with_suffix('.txt').name} beside the image"
            else:
                caption, error = read_caption_file(image.caption_path)
        yield Item(path=image.path, image=image.path, caption=caption, error=error)


class FolderSource(Source):
    """Images below a folder, recursively, sorted by their path relative to it."""

    kind = "folder"

    def __init__(self, folder: Path, shard_size: int, captions: Optional[bool] = None, repeat: int = 1,
                 require_captions: bool = False) -> None:
        folder = Path(folder).resolve()
        found, texts, dangling = walk_folder(str(folder))
        if not found:
            raise SourceError(f"no images ({', '.join(IMAGE_SUFFIXES)}) found below {folder}")
        base = len(str(folder)) + 1
        found.sort(key=lambda pair: pair[0][base:].replace(os.sep, "/"))
        if captions is None:  # auto: captions when any image has its .txt beside it
            captions = any(os.path.splitext(path)[0] in texts for path, _ in found) or require_captions
        if require_captions and not captions:
            raise SourceError("captions were turned off, but required")
        super().__init__(str(folder), has_images=True, has_captions=captions, repeat=repeat)
        self.require_captions = require_captions
        images = []
        for path, status in found:
            text = texts.get(os.path.splitext(path)[0]) if captions else None
            images.append(FolderImage(path, stamp_of(status), *((text[0], stamp_of(text[1])) if text else ())))
        self.images = images * repeat  # repeat: a benchmark's way to a steady state on a small folder
        self.shard_size = shard_size
        if dangling:
            self.notes.append(f"skipped {len(dangling)} dangling symlink(s) below {folder}, first {dangling[0]}")

    def settings(self) -> dict:
        return {**super().settings(), "shard_size": self.shard_size, "require_captions": self.require_captions}

    def shards(self) -> List[Shard]:
        plan = []
        for index, rows in enumerate(chunks(len(self.images), self.shard_size)):
            images = self.images[rows.start:rows.stop]
            inputs = []
            for image in images:
                inputs.append((image.path, image.stamp))
                if image.caption_path is not None:
                    inputs.append((image.caption_path, image.caption_stamp))
            plan.append(Shard(
                index=index, fingerprint=fingerprint_of(inputs),
                description=f"images {rows.start}..{rows.stop - 1} of {self.location}", size=len(images),
                load=functools.partial(load_folder_items, images, self.has_captions, self.require_captions),
                inputs=inputs))
        return plan
