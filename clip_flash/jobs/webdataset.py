"""WebDataset tar shards as a job's input: one output shard per tar (in the order given), samples in tar
order, members grouped into samples by key (the path up to the first dot of the file name).

A sample's image is the first of ``WDS_IMAGE_SUFFIXES`` it holds; its caption the ``txt`` member (or a
``caption``/``text`` field of its ``json``). The job reads captions when any tar holds one (it stops looking
at the first); a sample without one then gets an empty caption (``require_captions``: a failure).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import tarfile
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

from .items import Item, Shard, Source, SourceError, file_stamp, fingerprint_of

logger = logging.getLogger(__name__)

WDS_IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp")
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


def split_member_name(name: str):
    """WebDataset's rule: the key is the path up to the first dot of the file name, the rest its field."""
    directory, _, base = name.rpartition("/")
    stem, dot, field = base.partition(".")
    if not dot:
        return None
    return (directory + "/" + stem if directory else stem), field.lower()


def caption_from_json(data: bytes) -> Optional[str]:
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
                split = split_member_name(member.name)
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


def tar_has_caption(tar_path: str) -> bool:
    """Whether any sample of the tar has a caption (stops at the first; an unreadable tar has none)."""
    try:
        with tarfile.open(tar_path, mode="r:*") as archive:
            for member in archive:
                split = split_member_name(member.name) if member.isfile() else None
                if split is None:
                    continue
                if split[1] == "txt":
                    return True
                if split[1] == "json" and caption_from_json(archive.extractfile(member).read()) is not None:
                    return True
    except (tarfile.TarError, OSError, EOFError):
        pass
    return False


def load_tar_items(tar_path: str, captions: bool, require_captions: bool = False) -> Iterator[Item]:
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
                caption = caption_from_json(sample.get("json", b""))
                if caption is None:
                    caption = ""
                    if require_captions:
                        error = "sample has no caption (.txt or json caption)"
        if image is None:
            error = f"sample has no image ({'/'.join(WDS_IMAGE_SUFFIXES)})"
        yield Item(path=key, image=image, caption=caption, key=key, error=error)


class WebDatasetSource(Source):
    """Tar shards in the WebDataset layout: members grouped into samples by key, in tar order."""

    kind = "webdataset"

    def __init__(self, tars: Sequence[str], captions: Optional[bool] = None, repeat: int = 1,
                 require_captions: bool = False) -> None:
        if not tars:
            raise SourceError("no tar files given")
        missing = [tar for tar in tars if not os.path.isfile(tar)]
        if missing:
            raise SourceError(f"{len(missing)} tar file(s) not found, first {missing[0]}")
        resolved = [str(Path(tar).resolve()) for tar in tars]
        unique = list(dict.fromkeys(resolved))
        notes = []
        if len(unique) < len(resolved):
            repeated = sorted({tar for tar in resolved if resolved.count(tar) > 1})
            notes.append(f"{len(resolved) - len(unique)} tar name(s) given more than once (first {repeated[0]}): "
                         "each tar is read once")
        if require_captions and captions is False:
            raise SourceError("captions were turned off, but required")
        if captions is None:
            captions = require_captions or any(tar_has_caption(tar) for tar in unique)
        super().__init__(",".join(unique), has_images=True, has_captions=captions, repeat=repeat)
        self.notes.extend(notes)
        self.require_captions = require_captions
        self.tars = unique * repeat

    def settings(self) -> dict:
        return {**super().settings(), "require_captions": self.require_captions}

    def shards(self) -> List[Shard]:
        plan = []
        for index, tar in enumerate(self.tars):
            inputs = [(tar, file_stamp(tar))]
            plan.append(Shard(index=index, fingerprint=fingerprint_of(inputs), description=f"tar {tar}", size=None,
                              load=functools.partial(load_tar_items, tar, self.has_captions, self.require_captions),
                              inputs=inputs))
        return plan
