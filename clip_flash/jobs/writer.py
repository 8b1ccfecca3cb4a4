"""The output folder of an embedding job, in clip-retrieval's layout, written shard by shard, safely.

    OUT/img_emb/img_emb_{N}.npy          (rows, dim) float16/float32, what clip-retrieval writes
    OUT/text_emb/text_emb_{N}.npy
    OUT/metadata/metadata_{N}.parquet    image_path (+ caption, + key for WebDataset), same row order
    OUT/failures.parquet                 path, reason, shard: every input that could not be embedded
    OUT/_clip_flash/settings.json        what the embeddings depend on: a resumed job must match it
    OUT/_clip_flash/lock                 held (flock) by the job writing the folder; names its process
    OUT/_clip_flash/done/{N}.json        written last: shard N is complete (rows, fingerprint, sizes)
    OUT/_clip_flash/failures/{N}.parquet that shard's failures
    OUT/_clip_flash/runs/*.json          one record per run (versions, git revision, command, summary)

``{N}`` is zero-padded to the width of the last shard number (clip-retrieval's rule), so the files sort
in shard order: embedding-reader (used by autofaiss and ``clip-retrieval index``) lists ``*.npy`` and
``*.parquet`` sorted and pairs them by position, and skips empty ``.npy`` files. So a shard where every
input failed writes no ``.npy``/``.parquet`` at all (only its done marker and failures), and files in
flight are named ``*.tmp``, which those globs do not match.

Commit protocol, per shard: each file is written under a temporary name, flushed and fsynced, then
renamed into place; the done marker is written the same way after all of them. A shard without its
marker is unfinished whatever else exists: a restarted job deletes its files and embeds it again.
"""
from __future__ import annotations

import errno
import importlib.util
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

STATE_DIR = "_clip_flash"
SETTINGS_FILE = "settings.json"
FAILURES_FILE = "failures.parquet"


class OutputError(Exception):
    """The output folder cannot be used or written (unwritable, disk full, another job's settings)."""


class SettingsMismatchError(OutputError):
    """The output folder holds shards made with other settings: mixing them would corrupt the index."""


def shard_width(shard_count: int) -> int:
    """Digits of a shard number: clip-retrieval's ``int(log10(count)) + 1``."""
    return int(math.log10(max(shard_count, 1))) + 1


@dataclass
class ShardResult:
    """A finished shard, ready to write: embeddings and metadata row-aligned, plus its failures."""

    index: int
    fingerprint: str
    image_embeddings: Optional[np.ndarray]      # (rows, dim) or None for a text-only job
    text_embeddings: Optional[np.ndarray]       # (rows, dim) or None when the job has no captions
    metadata: Dict[str, List[Any]]              # column -> values, one per row
    failures: List[Tuple[str, str]] = field(default_factory=list)  # (path, reason)

    @property
    def rows(self) -> int:
        for embeddings in (self.image_embeddings, self.text_embeddings):
            if embeddings is not None:
                return int(embeddings.shape[0])
        return 0


def _fsync_dir(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _write_bytes_durably(path: Path, payload: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array))
    return buffer.getvalue()


def _parquet_bytes(columns: Dict[str, List[Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({name: pa.array(values, type=pa.string()) for name, values in columns.items()}), sink)
    return sink.getvalue().to_pybytes()


class OutputFolder:
    """One job's output folder: settings check, which shards are done, and atomic shard writes."""

    def __init__(self, root: Path, shard_count: int) -> None:
        self.root = Path(root)
        self.width = shard_width(shard_count)
        self.state = self.root / STATE_DIR
        self._lock: Optional[Any] = None

    # ----- names
    def name(self, index: int) -> str:
        return str(index).zfill(self.width)

    def shard_files(self, index: int) -> Dict[str, Path]:
        """Every file shard ``index`` may own, by role."""
        number = self.name(index)
        return {
            "img_emb": self.root / "img_emb" / f"img_emb_{number}.npy",
            "text_emb": self.root / "text_emb" / f"text_emb_{number}.npy",
            "metadata": self.root / "metadata" / f"metadata_{number}.parquet",
            "failures": self.state / "failures" / f"{number}.parquet",
        }

    def marker(self, index: int) -> Path:
        return self.state / "done" / f"{self.name(index)}.json"

    # ----- opening
    def open(self, settings: Dict[str, Any]) -> None:
        """Lock the folder for this job, then record ``settings`` in it, or refuse a folder made with other
        settings (before creating anything else in it). :meth:`close` releases the lock."""
        if importlib.util.find_spec("pyarrow") is None:  # checked now, not after the first shard is embedded
            raise OutputError("the embedding job writes parquet files and needs pyarrow: pip install pyarrow")
        try:
            self.state.mkdir(parents=True, exist_ok=True)
            self._take_lock()
        except OSError as error:
            raise OutputError(f"cannot use output folder {self.root}: {error}") from error
        try:
            existing = self.state / SETTINGS_FILE
            if existing.exists() and json.loads(existing.read_text()) != settings:
                raise SettingsMismatchError(self._mismatch_message(json.loads(existing.read_text()), settings))
            source = settings.get("source", {})
            # like clip-retrieval, only the embedding folders the job fills (an empty one stops `clip-retrieval index`)
            folders = ["img_emb"] * bool(source.get("images", True)) + ["text_emb"] * bool(source.get("captions", True))
            for sub in folders + ["metadata", f"{STATE_DIR}/done", f"{STATE_DIR}/failures", f"{STATE_DIR}/runs"]:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            if not existing.exists():
                self._atomic_write(existing, (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode())
        except BaseException as error:
            self.close()
            if isinstance(error, OSError):
                raise OutputError(f"cannot use output folder {self.root}: {error}") from error
            raise

    def _take_lock(self) -> None:
        """One job per folder at a time: two would embed the same unfinished shards twice over each other."""
        import fcntl

        handle = open(self.state / "lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise OutputError(f"another job is writing to {self.root} ({holder}); wait for it to end, or "
                              "use another --out folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        handle.flush()
        self._lock = handle

    def close(self) -> None:
        """Release the folder for the next job (the lock also goes when the process ends, however it ends)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _mismatch_message(self, recorded: Dict[str, Any], wanted: Dict[str, Any]) -> str:
        keys = sorted(set(recorded) | set(wanted))
        lines = [f"  {key}: folder has {recorded.get(key)!r}, this job {wanted.get(key)!r}"
                 for key in keys if recorded.get(key) != wanted.get(key)]
        return (f"output folder {self.root} holds embeddings made with other settings; refusing to mix them:\n"
                + "\n".join(lines) + "\n  Use another --out folder, or the same settings to resume.")

    # ----- state
    def finished(self, index: int, fingerprint: str) -> bool:
        """Whether shard ``index`` is complete with exactly these inputs.

        Raises :class:`OutputError` when it was made from other inputs (the input changed between runs).
        A marker whose files are gone or of another size is taken as unfinished (logged).
        """
        marker = self.marker(index)
        if not marker.exists():
            return False
        try:
            record = json.loads(marker.read_text())
        except (OSError, ValueError) as error:
            logger.warning("shard %s: unreadable done marker (%s); embedding it again", self.name(index), error)
            return False
        if record.get("fingerprint") != fingerprint:
            raise OutputError(
                f"shard {self.name(index)} in {self.root} was made from other inputs than this job plans for it "
                "(files added, removed or renamed since the first run). Embed the changed input into a new "
                "--out folder.")
        for role, size in record.get("sizes", {}).items():
            path = self.shard_files(index)[role]
            if not path.exists() or path.stat().st_size != size:
                logger.warning("shard %s: %s is missing or changed; embedding the shard again",
                               self.name(index), path.name)
                return False
        return True

    def clear(self, index: int) -> None:
        """Remove whatever an unfinished shard left (files, temporaries, a stale marker)."""
        for path in [*self.shard_files(index).values(), self.marker(index)]:
            for candidate in (path, path.with_name(path.name + ".tmp")):
                try:
                    candidate.unlink()
                except FileNotFoundError:
                    pass

    def _atomic_write(self, path: Path, payload: bytes) -> None:
        temporary = path.with_name(path.name + ".tmp")
        try:
            _write_bytes_durably(temporary, payload)
            os.replace(temporary, path)
        except BaseException:
            try:
                temporary.unlink()
            except OSError:
                pass
            raise
        _fsync_dir(path.parent)

    # ----- writing
    def write(self, result: ShardResult) -> None:
        """Commit one shard: its files, then its done marker. Raises :class:`OutputError` on disk errors,
        after removing this shard's partial files (finished shards are never touched)."""
        files = self.shard_files(result.index)
        payloads: Dict[str, bytes] = {}
        if result.rows:
            if result.image_embeddings is not None:
                payloads["img_emb"] = _npy_bytes(result.image_embeddings)
            if result.text_embeddings is not None:
                payloads["text_emb"] = _npy_bytes(result.text_embeddings)
            payloads["metadata"] = _parquet_bytes(result.metadata)
        if result.failures:
            paths, reasons = zip(*result.failures)
            payloads["failures"] = _parquet_bytes({"path": list(paths), "reason": list(reasons)})
        try:
            self.clear(result.index)
            for role, payload in payloads.items():
                self._atomic_write(files[role], payload)
            marker = {"shard": self.name(result.index), "fingerprint": result.fingerprint, "rows": result.rows,
                      "failures": len(result.failures),
                      "sizes": {role: len(payload) for role, payload in payloads.items()}}
            self._atomic_write(self.marker(result.index), (json.dumps(marker) + "\n").encode())
        except OSError as error:
            try:
                self.clear(result.index)
            except OSError:
                pass
            hint = " (disk full)" if error.errno == errno.ENOSPC else ""
            raise OutputError(
                f"could not write shard {self.name(result.index)} to {self.root}{hint}: {error}. "
                "Shards already finished are intact; free space or fix the folder and run the same command "
                "again to resume.") from error

    def marker_record(self, index: int) -> Dict[str, Any]:
        return json.loads(self.marker(index).read_text())

    def collect_failures(self, shard_indices: Sequence[int]) -> int:
        """Write OUT/failures.parquet from every finished shard's failures; return how many there are."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for index in shard_indices:
            path = self.shard_files(index)["failures"]
            if path.exists() and self.marker(index).exists():
                table = pq.read_table(path)
                tables.append(table.append_column("shard", pa.array([self.name(index)] * table.num_rows)))
        schema = pa.schema([("path", pa.string()), ("reason", pa.string()), ("shard", pa.string())])
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        try:
            self._atomic_write(self.root / FAILURES_FILE, sink.getvalue().to_pybytes())
        except OSError as error:
            raise OutputError(f"could not write {self.root / FAILURES_FILE}: {error}") from error
        return table.num_rows

    def write_run_record(self, name: str, record: Dict[str, Any]) -> Path:
        path = self.state / "runs" / name
        try:
            self._atomic_write(path, (json.dumps(record, indent=2, default=str) + "\n").encode())
        except OSError as error:
            raise OutputError(f"could not write the run record {path}: {error}") from error
        return path


def free_bytes(path: Path) -> Optional[int]:
    """Free space where ``path`` lives, or None when it cannot be told."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
