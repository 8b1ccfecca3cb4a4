"""What an embedding job reads: an image folder, WebDataset tar shards, or a file of captions.

Every source is cut into a fixed plan of numbered shards before anything is embedded, so a restarted
job finds the same shards under the same numbers and skips the finished ones:

- image folder (:mod:`.folder`): every image below the folder (recursive, sorted by relative path),
  ``shard_size`` items per shard; ``a/b.txt`` beside ``a/b.jpg`` is its caption, as clip-retrieval reads it;
- WebDataset (:mod:`.webdataset`): one output shard per input tar (in the order given), its samples in
  tar order;
- captions (:mod:`.caption_file`): one per line of a ``.txt``, or a column of a ``.csv``/``.tsv``/``.parquet``,
  ``shard_size`` rows per shard, in file order.

Captions are read where they exist: an image or sample without one gets an empty caption, unless the job
requires captions (then it is a failure). A shard's ``fingerprint`` covers what its rows depend on (each
file's size and modification time, a caption file's text); the writer stores it with the finished shard,
so inputs that changed between two runs are refused (and named) rather than embedded twice or not at all.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .caption_file import CAPTION_FILE_SUFFIXES, CaptionFileSource, load_caption_items, read_captions
from .folder import IMAGE_SUFFIXES, FolderSource, load_folder_items
from .items import Item, Shard, Source, SourceError
from .webdataset import WDS_IMAGE_SUFFIXES, WebDatasetSource, expand_braces, load_tar_items, tar_samples

__all__ = [
    "CAPTION_FILE_SUFFIXES", "IMAGE_SUFFIXES", "WDS_IMAGE_SUFFIXES", "CaptionFileSource", "FolderSource", "Item",
    "Shard", "Source", "SourceError", "WebDatasetSource", "expand_braces", "load_caption_items",
    "load_folder_items", "load_tar_items", "open_source", "read_captions", "tar_samples",
]


def open_source(location: Union[str, Path], shard_size: int, captions: Optional[bool] = None,
                caption_column: Optional[str] = None, repeat: int = 1, require_captions: bool = False) -> Source:
    """The source a path names: a folder of tars or images, tar file(s) (``{a..b}`` patterns too), or a
    caption file. ``captions=None`` reads captions where the input has them; ``require_captions`` makes an
    image without one a failure."""
    text = str(location)
    tars = expand_braces(text) if text.endswith(".tar") or "{" in text else []
    if tars:
        source: Source = WebDatasetSource(tars, captions, repeat, require_captions)
    else:
        path = Path(text)
        if not path.exists():
            raise SourceError(f"input not found: {path}")
        if path.is_dir():
            folder_tars = sorted(str(tar) for tar in path.glob("*.tar"))
            has_images = any(child.suffix.lower() in IMAGE_SUFFIXES for child in path.rglob("*"))
            if folder_tars and not has_images:
                source = WebDatasetSource(folder_tars, captions, repeat, require_captions)
            else:
                source = FolderSource(path, shard_size, captions, repeat, require_captions)
        elif path.suffix.lower() in CAPTION_FILE_SUFFIXES:
            if captions is False:
                raise SourceError(f"{path} is a caption file, but captions were turned off")
            source = CaptionFileSource(path, shard_size, caption_column, repeat)
        else:
            raise SourceError(f"cannot tell what {path} is: give a folder of images, WebDataset .tar file(s), "
                              f"or a caption file ({', '.join(CAPTION_FILE_SUFFIXES)})")
    if caption_column is not None and source.kind != "captions":
        source.notes.append(f"caption column {caption_column!r} ignored: {text} is not a CSV or parquet file")
    return source
