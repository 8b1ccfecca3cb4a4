"""What identifies a job's weights: a checkpoint file by the SHA-256 of its bytes, not its path or size.

A checkpoint replaced at the same path (even with the same size) must not go on filling a folder embedded
with the old one. Hashing a large checkpoint takes seconds, so the digest is cached by (path, size,
modification time) in a small JSON file: a resumed job hashes again only when the file was touched.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20


def file_sha256(path: str) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def _read_cache(cache_file: Path) -> Dict[str, Any]:
    try:
        cache = json.loads(cache_file.read_text())
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def checkpoint_sha256(path: str, cache_file: Optional[Path] = None) -> str:
    """The SHA-256 of the checkpoint at ``path``, from ``cache_file`` when the file's size and modification
    time are those it was hashed at; else hashed now and cached (a cache that cannot be written is skipped;
    None: no cache)."""
    real = os.path.realpath(path)
    status = os.stat(real)
    stamp = {"size": status.st_size, "mtime_ns": status.st_mtime_ns}
    cache = _read_cache(cache_file) if cache_file is not None else {}
    entry = cache.get(real)
    if isinstance(entry, dict) and all(entry.get(key) == value for key, value in stamp.items()) \
            and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    logger.info("hashing checkpoint %s (%.1f MB) to identify its weights", path, status.st_size / 1e6)
    digest = file_sha256(real)
    if cache_file is None:
        return digest
    cache[real] = {**stamp, "sha256": digest}
    temporary = cache_file.with_name(cache_file.name + f".{os.getpid()}.tmp")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(cache, indent=1) + "\n")
        os.replace(temporary, cache_file)
    except OSError as error:
        logger.debug("could not cache the checkpoint's digest in %s: %s", cache_file, error)
        temporary.unlink(missing_ok=True)
    return digest
