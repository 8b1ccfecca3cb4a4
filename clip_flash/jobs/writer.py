"""The output folder of an embedding job, in clip-retrieval's layout, written shard by shard, safely.

    OUT/img_emb/img_emb_{N}.npy          (rows, dim) float16/float32, what clip-retrieval writes
    OUT/text_emb/text_emb_{N}.npy
    OUT/metadata/metadata_{N}.parquet    image_path (+ caption, + key for WebDataset), same row order
    OUT/failures.parquet                 path, reason, shard: every input that could not be embedded
    OUT/_clip_flash/settings.json        what the embeddings depend on: a resumed job must match it
    OUT/_clip_flash/lock                 held (flock) by the job writing the folder; names its process
    OUT/_clip_flash/done/{N}.json        written last: shard N is complete (rows, fingerprint, sizes)
    OUT/_clip_flash/failures/{N}.parquet that shard's failures
    OUT/_clip_flash/inputs/{N}.json.gz   that shard's inputs with their stamps (to name what changed)
    OUT/_clip_flash/runs/*.json          one record per run (versions, git revision, command, summary)

``{N}`` is zero-padded to the width of the last shard number (clip-retrieval's rule), so the files sort
in shard order: embedding-reader (used by autofaiss and ``clip-retrieval index``) lists ``*.npy`` and
``*.parquet`` sorted and pairs them by position, and skips empty ``.npy`` files. So a shard where every
input failed writes no ``.npy``/``.parquet`` at all (only its done marker and failures), and files in
flight are named ``*.tmp``, which those globs do not match.

Commit protocol, per shard: each file is written under a temporary name, flushed and fsynced, then
renamed into place; the done marker is written the same way after all of them. A shard without its
marker is unfinished whatever else exists: a restarted job deletes its files and embeds it again.

The settings are written once the job's model has loaded, and only a folder holding a finished shard
refuses a job with other settings: a start that failed (a misspelt model, a missing checkpoint) leaves
nothing that stands in the way of the corrected command.

Names are stored as text: a file name that is not valid UTF-8 (Python gives its stray bytes as lone
surrogates) is written with each such byte as ``\\xNN`` (:func:`stored_text`), so the job never stops on
it; undoing the ``\\xNN`` escapes gives the name's bytes back (``os.fsencode`` of the name as Python listed it).
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

from .file_formats import inputs_bytes, npy_bytes, parquet_bytes, stored_text

logger = logging.getLogger(__name__)

STATE_DIR = "_clip_flash"
SETTINGS_FILE = "settings.json"
FAILURES_FILE = "failures.parquet"


class OutputError(Exception):
    """The output folder cannot be used or written (unwritable, disk full, another job's settings)."""


class SettingsMismatchError(OutputError):
    """The output folder holds shards made with other settings: mixing them would corrupt the index."""


class InputChangedError(OutputError):
    """Inputs that finished shards were embedded from changed since (edited, added, removed or renamed)."""


SHARD_FILE_PATTERNS = ("img_emb/img_emb_*.npy", "text_emb/text_emb_*.npy", "metadata/metadata_*.parquet",
                       f"{STATE_DIR}/failures/*.parquet", f"{STATE_DIR}/inputs/*.json.gz", f"{STATE_DIR}/done/*.json")
# Settings that follow from the input rather than from the command: a difference there means the input changed.
INPUT_SETTINGS = ("shards",)
MAX_LISTED = 5


def _flatten(settings: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(stored_text(name) for name in list(names)[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


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
    metadata: Dict[str, Any]                    # column -> values (a list, or a batches.LazyColumn), one per row
    failures: List[Tuple[str, str]] = field(default_factory=list)  # (path, reason)
    inputs: List[Tuple[str, str]] = field(default_factory=list)    # (input, stamp): see sources.Shard.inputs

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
            "inputs": self.state / "inputs" / f"{number}.json.gz",
        }

    def marker(self, index: int) -> Path:
        return self.state / "done" / f"{self.name(index)}.json"

    # ----- opening
    def open(self, settings: Dict[str, Any]) -> None:
        """:meth:`acquire`, :meth:`check` and :meth:`record_settings` at once (a job with nothing to load)."""
        self.acquire()
        try:
            self.check(settings)
            self.record_settings(settings)
        except BaseException:
            self.close()
            raise

    def acquire(self) -> None:
        """Lock the folder for this job (created if missing). :meth:`close` releases the lock."""
        if importlib.util.find_spec("pyarrow") is None:  # checked now, not after the first shard is embedded
            raise OutputError("the embedding job writes parquet files and needs pyarrow: pip install pyarrow")
        if self.root.exists() and not self.root.is_dir():
            raise OutputError(f"--out {self.root} is a file: the output is a folder (created when missing); "
                              "name a folder")
        try:
            self.state.mkdir(parents=True, exist_ok=True)
            self._take_lock()
        except OSError as error:
            raise OutputError(f"cannot use output folder {self.root}: {error.strerror or error}") from error

    def finished_markers(self) -> List[Path]:
        return sorted((self.state / "done").glob("*.json"))

    def check(self, settings: Dict[str, Any]) -> None:
        """Refuse a folder whose finished shards were made with other settings. A folder without a finished
        shard is this job's: whatever an earlier start left there (settings, partial files) is removed."""
        existing = self.state / SETTINGS_FILE
        try:
            recorded = json.loads(existing.read_text()) if existing.exists() else None
        except (OSError, ValueError):
            recorded = {}
        if recorded is None or recorded == settings:
            return
        if not self.finished_markers():
            logger.info("%s holds no finished shard: starting it over with this job's settings", self.root)
            self._start_over()
            return
        raise self._mismatch(recorded, settings)

    def _start_over(self) -> None:
        try:
            for pattern in SHARD_FILE_PATTERNS:
                for path in [*self.root.glob(pattern), *self.root.glob(pattern + ".tmp")]:
                    path.unlink()
            (self.state / SETTINGS_FILE).unlink(missing_ok=True)
            for folder in ("img_emb", "text_emb"):  # an empty embedding folder stops `clip-retrieval index`
                if (self.root / folder).is_dir() and not any((self.root / folder).iterdir()):
                    (self.root / folder).rmdir()
        except OSError as error:
            raise OutputError(f"cannot clear output folder {self.root}: {error}") from error

    def record_settings(self, settings: Dict[str, Any]) -> None:
        """Create the folders the job fills and record ``settings`` (once the job is known to be able to run)."""
        existing = self.state / SETTINGS_FILE
        source = settings.get("source", {})
        # like clip-retrieval, only the embedding folders the job fills (an empty one stops `clip-retrieval index`)
        folders = ["img_emb"] * bool(source.get("images", True)) + ["text_emb"] * bool(source.get("captions", True))
        try:
            for sub in folders + ["metadata", f"{STATE_DIR}/done", f"{STATE_DIR}/failures", f"{STATE_DIR}/inputs",
                                  f"{STATE_DIR}/runs"]:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            if not existing.exists():
                self._atomic_write(existing, (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode())
        except OSError as error:
            raise OutputError(f"cannot use output folder {self.root}: {error}") from error

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

    def _mismatch(self, recorded: Dict[str, Any], wanted: Dict[str, Any]) -> OutputError:
        """What differs, one line per setting (``folder has X, this job Y``), and how to go on."""
        old, new = _flatten(recorded), _flatten(wanted)
        differing = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
        lines = [f"  {key}: folder has {old.get(key, '(not set)')!r}, this job {new.get(key, '(not set)')!r}"
                 for key in differing]
        start_over = (f"  To start over, delete {self.root} or pass another --out; to resume, run the command "
                      "that made it.")
        if all(key in INPUT_SETTINGS for key in differing):
            return InputChangedError(
                f"the input changed since {self.root} was started (inputs added or removed), refusing to mix:\n"
                + "\n".join(lines) + "\n" + start_over)
        return SettingsMismatchError(
            f"output folder {self.root} holds embeddings made with other settings; refusing to mix them:\n"
            + "\n".join(lines) + "\n" + start_over)

    # ----- state
    def finished(self, index: int, fingerprint: str, inputs: Sequence[Tuple[str, str]] = ()) -> bool:
        """Whether shard ``index`` is complete with exactly these inputs.

        Raises :class:`InputChangedError` when it was made from other inputs (the input changed between runs),
        naming them where the shard's ``inputs`` were kept.
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
            raise InputChangedError(self._changed_inputs_message(index, inputs))
        for role, size in record.get("sizes", {}).items():
            path = self.shard_files(index)[role]
            if not path.exists() or path.stat().st_size != size:
                logger.warning("shard %s: %s is missing or changed; embedding the shard again",
                               self.name(index), path.name)
                return False
        return True

    def recorded_inputs(self, index: int) -> Optional[List[Tuple[str, str]]]:
        import gzip

        try:
            return [tuple(pair) for pair in json.loads(gzip.decompress(self.shard_files(index)["inputs"].read_bytes()))]
        except (OSError, ValueError):
            return None

    def _changed_inputs_message(self, index: int, inputs: Sequence[Tuple[str, str]]) -> str:
        before = self.recorded_inputs(index)
        lines = []
        if before is not None and inputs:
            old, new = dict(before), dict(inputs)
            for label, names in (("changed (size or modification time)",
                                  [name for name in new if name in old and old[name] != new[name]]),
                                 ("added", [name for name in new if name not in old]),
                                 ("removed or renamed", [name for name in old if name not in new])):
                if names:
                    lines.append(f"  {label}: {_listed(names)}")
        detail = "\n".join(lines) or "  (files added, removed, renamed or edited)"
        return (f"the input changed since shard {self.name(index)} of {self.root} was embedded; refusing to mix "
                f"old and new rows:\n{detail}\n  Embed the changed input into a new --out folder (or delete "
                f"{self.root} to start over).")

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
                payloads["img_emb"] = npy_bytes(result.image_embeddings)
            if result.text_embeddings is not None:
                payloads["text_emb"] = npy_bytes(result.text_embeddings)
            payloads["metadata"] = parquet_bytes(result.metadata)
        if result.failures:
            paths, reasons = zip(*result.failures)
            payloads["failures"] = parquet_bytes({"path": list(paths), "reason": list(reasons)})
        if result.inputs:
            payloads["inputs"] = inputs_bytes(result.inputs)
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
