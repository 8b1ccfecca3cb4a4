"""Measured attention tables: their schema, parsing, and where they come from.

A *table* (JSON, written on the GPU by ``clip-flash measure-attention``) records, for attention shapes of real
OpenCLIP models, the milliseconds each backend took and which won::

    {"gpu": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "torch": "2.11.0+cu130", "cuda": "13.0",
     "flash_attn": "2.8.3" | null, "command": "...", "created": "...",
     "entries": [{"dtype": "float16", "causal": false, "varlen": false, "batch": 256, "seq": 257,
                  "heads": 16, "head_dim": 64, "ms": {"sdpa:cudnn": <median ms>, "flash_attn": ..., ...},
                  "best": "sdpa:cudnn", "device_ms": {"sdpa:cudnn": <median ms>, ...}}, ...]}

``ms`` is one call as it runs eagerly: from the device reaching it to its end, the host's launch included
(at small shapes the launch is most of it). ``device_ms`` (optional) is the kernel alone on a device kept busy
ahead of it, which is what a CUDA graph's replay pays; a call clip_flash captures into a graph is chosen by it.

For variable-length (packed) entries ``batch`` is the number of sequences, ``seq`` the longest one and
``tokens`` their total. A table applies only on a GPU with the same name (and capability, when recorded).

Where tables come from, first that applies wins: tables registered with ``load_attention_table`` (newest
first), the file named by ``CLIP_FLASH_ATTENTION_TABLE``, then the tables shipped in
``clip_flash/backends/attention_tables/``. Choosing a backend from a table is ``measured.py``'s job.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from .. import envs

logger = logging.getLogger(__name__)

TABLE_ENV = envs.ATTENTION_TABLE.name
SHIPPED_TABLE_DIR = Path(__file__).resolve().parent / "attention_tables"
MEASURE_HINT = ("measure one on this GPU with `clip-flash measure-attention` and ship it in "
                "clip_flash/backends/attention_tables/, set CLIP_FLASH_ATTENTION_TABLE=/path.json, or call "
                "clip_flash.backends.load_attention_table(path)")

_DTYPE_NAMES = {
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_TABLE_DTYPES = tuple(_TORCH_DTYPES.values())

DtypeLike = Union[str, torch.dtype]
Capability = Tuple[int, int]


class AttentionTableError(ValueError):
    """A table file that cannot be read or does not have the expected format (the message says where)."""


def dtype_name(dtype: DtypeLike) -> str:
    """``torch.float16`` / ``"fp16"`` / ``"float16"`` -> ``"float16"`` (the spelling tables use)."""
    text = str(dtype).replace("torch.", "").lower()
    try:
        return _DTYPE_NAMES[text]
    except KeyError:
        raise AttentionTableError(f"unknown dtype {dtype!r}; use one of {sorted(set(_DTYPE_NAMES.values()))}") from None


# -- the table -----------------------------------------------------------------------------------------------

@dataclass
class TableEntry:
    """One measured attention shape: per backend its median milliseconds (None: it failed, see ``errors``), eager
    (``ms``) and, where measured, replayed (``device_ms``: the kernel alone)."""

    dtype: str
    causal: bool
    varlen: bool
    batch: int
    seq: int
    heads: int
    head_dim: int
    ms: Dict[str, Optional[float]]
    best: Optional[str] = None
    tokens: Optional[int] = None
    errors: Dict[str, str] = field(default_factory=dict)
    device_ms: Dict[str, Optional[float]] = field(default_factory=dict)

    def fastest(self, usable: Callable[[str], bool], replay: bool = False) -> Optional[str]:
        """The fastest backend of this entry that ``usable`` allows: by ``device_ms`` for a graph's replay where
        the entry has them, else by ``ms`` (``best`` if no timing is usable)."""
        if replay:
            timed = [(ms, name) for name, ms in self.device_ms.items() if ms is not None and usable(name)]
            if timed:
                return min(timed)[1]
        timed = [(ms, name) for name, ms in self.ms.items() if ms is not None and usable(name)]
        if timed:
            return min(timed)[1]
        return self.best if self.best is not None and usable(self.best) else None

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {
            "dtype": self.dtype, "causal": self.causal, "varlen": self.varlen, "batch": self.batch,
            "seq": self.seq, "heads": self.heads, "head_dim": self.head_dim,
        }
        if self.tokens is not None:
            data["tokens"] = self.tokens
        data["ms"] = dict(self.ms)
        data["best"] = self.best
        if self.device_ms:
            data["device_ms"] = dict(self.device_ms)
        if self.errors:
            data["errors"] = dict(self.errors)
        return data


@dataclass
class AttentionTable:
    """A parsed timing table: which GPU it was measured on, and its entries."""

    gpu: str
    capability: Optional[Capability]
    entries: List[TableEntry]
    source: str = "<memory>"
    meta: Dict[str, Any] = field(default_factory=dict)  # torch, cuda, flash_attn, command, created, ...

    def applies_to(self, gpu: str, capability: Optional[Capability]) -> bool:
        """Same GPU name, and same compute capability when both are known."""
        if gpu != self.gpu:
            return False
        return self.capability is None or capability is None or tuple(capability) == self.capability

    def has_site(self, dtype: DtypeLike, head_dim: int, causal: bool) -> bool:
        """Whether any entry (padded or packed) has this dtype, head dim and causality."""
        name = dtype_name(dtype)
        return any(e.dtype == name and e.head_dim == head_dim and e.causal == causal for e in self.entries)

    def kind_entries(self, dtype: DtypeLike, causal: bool, varlen: bool, head_dim: int) -> List[TableEntry]:
        """Entries with this dtype, causality, packing and head dim (any number of heads)."""
        name = dtype_name(dtype)
        return [e for e in self.entries
                if e.dtype == name and e.causal == causal and e.varlen == varlen and e.head_dim == head_dim]

    def describe(self) -> str:
        return f"{self.source} ({self.gpu}, {len(self.entries)} entries)"

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"gpu": self.gpu, "capability": list(self.capability) if self.capability else None}
        data.update(self.meta)
        data["entries"] = [entry.to_dict() for entry in self.entries]
        return data


def _require(data: dict, key: str, kind, where: str):
    if key not in data:
        raise AttentionTableError(f"{where}: missing {key!r}")
    value = data[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise AttentionTableError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _timings(raw: Dict[Any, Any], key: str, where: str) -> Dict[str, Optional[float]]:
    """Per backend a positive number of milliseconds or null (the backend failed there)."""
    timings: Dict[str, Optional[float]] = {}
    for name, value in raw.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise AttentionTableError(f"{where}: {key}[{name!r}] must be a positive number or null, got {value!r}")
        timings[str(name)] = None if value is None else float(value)
    return timings


def _parse_entry(data: Any, where: str) -> TableEntry:
    if not isinstance(data, dict):
        raise AttentionTableError(f"{where}: an entry must be an object, got {type(data).__name__}")
    ms = _timings(_require(data, "ms", dict, where), "ms", where)
    device_ms = _timings(_require(data, "device_ms", dict, where) if "device_ms" in data else {}, "device_ms", where)
    best = data.get("best")
    if best is not None and not isinstance(best, str):
        raise AttentionTableError(f"{where}: 'best' must be a backend name or null, got {best!r}")
    tokens = data.get("tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise AttentionTableError(f"{where}: 'tokens' must be an integer, got {tokens!r}")
    try:
        dtype = dtype_name(_require(data, "dtype", str, where))
    except AttentionTableError as error:
        raise AttentionTableError(str(error) if str(error).startswith(where) else f"{where}: {error}") from None
    entry = TableEntry(
        dtype=dtype,
        causal=_require(data, "causal", bool, where),
        varlen=_require(data, "varlen", bool, where) if "varlen" in data else False,
        batch=_require(data, "batch", int, where),
        seq=_require(data, "seq", int, where),
        heads=_require(data, "heads", int, where),
        head_dim=_require(data, "head_dim", int, where),
        ms=ms, best=best, tokens=tokens,
        errors={str(k): str(v) for k, v in (data.get("errors") or {}).items()},
        device_ms=device_ms,
    )
    if min(entry.batch, entry.seq, entry.heads, entry.head_dim) < 1:
        raise AttentionTableError(f"{where}: batch, seq, heads and head_dim must be >= 1")
    return entry


def parse_table(data: Any, source: str = "<memory>") -> AttentionTable:
    """An ``AttentionTable`` from the decoded JSON of a table file; ``AttentionTableError`` says what is wrong."""
    if not isinstance(data, dict):
        raise AttentionTableError(f"{source}: a table must be a JSON object, got {type(data).__name__}")
    gpu = _require(data, "gpu", str, source)
    capability_raw = data.get("capability")
    capability: Optional[Capability] = None
    if capability_raw is not None:
        if (not isinstance(capability_raw, (list, tuple)) or len(capability_raw) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in capability_raw)):
            raise AttentionTableError(f"{source}: 'capability' must be [major, minor], got {capability_raw!r}")
        capability = (capability_raw[0], capability_raw[1])
    entries_raw = _require(data, "entries", list, source)
    entries = [_parse_entry(entry, f"{source}: entries[{i}]") for i, entry in enumerate(entries_raw)]
    meta = {k: v for k, v in data.items() if k not in ("gpu", "capability", "entries")}
    return AttentionTable(gpu=gpu, capability=capability, entries=entries, source=source, meta=meta)


def read_table(path: Union[str, os.PathLike]) -> AttentionTable:
    """Read and parse a table file (not registered: see ``load_attention_table``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise AttentionTableError(f"{path}: cannot read attention table ({error})") from None
    except json.JSONDecodeError as error:
        raise AttentionTableError(f"{path}: not valid JSON ({error})") from None
    return parse_table(data, str(path))


# -- where tables come from ------------------------------------------------------------------------------------

_lock = threading.Lock()
_registered: List[AttentionTable] = []  # newest last
_file_cache: Dict[str, Tuple[float, Optional[AttentionTable]]] = {}  # path -> (mtime, table or None if broken)
_logged: set = set()
_on_change: List[Callable[[], None]] = []  # caches built from tables (measured.py's per-site backends)


def on_tables_changed(callback: Callable[[], None]) -> None:
    """Call ``callback`` (under the tables' lock) whenever a table is registered or the tables are cleared."""
    _on_change.append(callback)


def load_attention_table(path: Union[str, os.PathLike, AttentionTable]) -> AttentionTable:
    """Register a table (a path, or an ``AttentionTable``); it takes precedence over every table before it.

    It is used by ``patch(model, backend="auto")`` calls made afterwards, on a GPU the table applies to.
    Raises ``AttentionTableError`` when the file cannot be read or parsed.
    """
    table = path if isinstance(path, AttentionTable) else read_table(path)
    with _lock:
        _registered.append(table)
        for callback in _on_change:
            callback()
    logger.info("clip_flash: registered attention table %s", table.describe())
    return table


def clear_attention_tables() -> None:
    """Forget tables registered with ``load_attention_table`` and every cached file and decision."""
    with _lock:
        _registered.clear()
        _file_cache.clear()
        _logged.clear()
        for callback in _on_change:
            callback()


def _cached_file(path: Path, quiet_missing: bool = False) -> Optional[AttentionTable]:
    """A table file read once (again if it changed); a broken file is logged and skipped, never raised."""
    try:
        mtime = path.stat().st_mtime
    except OSError as error:
        if not quiet_missing:
            logger.warning("clip_flash: attention table %s cannot be read (%s); ignoring it", path, error)
        return None
    key = str(path)
    cached = _file_cache.get(key)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        table: Optional[AttentionTable] = read_table(path)
    except AttentionTableError as error:
        logger.warning("clip_flash: ignoring attention table: %s", error)
        table = None
    _file_cache[key] = (mtime, table)
    return table


def shipped_table_paths() -> List[Path]:
    """The table files shipped with the package."""
    return sorted(SHIPPED_TABLE_DIR.glob("*.json")) if SHIPPED_TABLE_DIR.is_dir() else []


def candidate_tables() -> List[AttentionTable]:
    """Every known table in precedence order: registered (newest first), the env var's, shipped ones."""
    with _lock:
        tables = list(reversed(_registered))
    env_path = os.environ.get(TABLE_ENV, "").strip()
    if env_path:
        table = _cached_file(Path(env_path).expanduser())
        if table is not None:
            tables.append(table)
    for path in shipped_table_paths():
        table = _cached_file(path, quiet_missing=True)
        if table is not None:
            tables.append(table)
    return tables


def current_gpu() -> Optional[Tuple[str, Capability]]:
    """(name, capability) of the current CUDA device, or None without CUDA. Tests replace this."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(), tuple(torch.cuda.get_device_capability())


def active_table() -> Optional[AttentionTable]:
    """The table that applies to the current GPU (None without CUDA or without a matching table).

    Logs once per process (per GPU and table) which table is in use, or that none applies and how to make one.
    """
    gpu = current_gpu()
    if gpu is None:
        return None
    name, capability = gpu
    table = next((t for t in candidate_tables() if t.applies_to(name, capability)), None)
    key = (name, capability, table.source if table is not None else None)
    if key not in _logged:
        _logged.add(key)
        if table is not None:
            logger.info("clip_flash: backend='auto' uses the measured attention table %s", table.describe())
        else:
            logger.info("clip_flash: no measured attention table for %s (sm_%d%d); backend='auto' takes the first "
                        "backend that serves a site in a fixed order. To choose from measurements, %s",
                        name, capability[0], capability[1], MEASURE_HINT)
    return table


__all__ = [
    "TABLE_ENV", "SHIPPED_TABLE_DIR", "MEASURE_HINT", "AttentionTable", "AttentionTableError", "TableEntry",
    "parse_table", "read_table", "load_attention_table", "clear_attention_tables", "candidate_tables",
    "shipped_table_paths", "current_gpu", "active_table", "dtype_name", "on_tables_changed",
]
