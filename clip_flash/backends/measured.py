"""``backend="auto"`` from measured numbers: per GPU and attention shape, the kernel that was fastest there.

The numbers come from a measured table (``attention_table.py``: schema, parsing, which table applies here);
``shape_timings.py`` estimates each backend's time at a call's shape from them and chooses.
``MeasuredAutoBackend`` serves one kind of site (dtype, head dim, causal) and picks the backend per call from
the call's shapes: a thread-local flag and one dict lookup per call once a shape has been seen, pure Python on
shapes (no device sync), so CUDA-graph capture and ``torch.compile`` see only the chosen kernel. A call warming
up or being captured into one of clip_flash's CUDA graphs (``choosing_for_replay``) is chosen by the table's
device times where it has them (a replay pays the kernel, not its launch); any other call by its eager times.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from . import attention_table
from .attention_table import (
    AttentionTable, DtypeLike, TableEntry, _TABLE_DTYPES, _TORCH_DTYPES, active_table, dtype_name,
)
from .base import AttentionBackend, AttentionNeeds, BackendStatus
from .registry import _BACKENDS, AUTO_ORDER, fallback_backend, get_backend, runnable_on
from .shape_timings import TimedShape, choose_at, winners

logger = logging.getLogger(__name__)

_lock = attention_table._lock  # the tables' lock: registering a table clears these backends under it
_site_backends: Dict[tuple, "MeasuredAutoBackend"] = {}
attention_table.on_tables_changed(_site_backends.clear)


def describe_auto_choice() -> str:
    """One line for reports and ``python -m clip_flash.info``: the table ``auto`` uses here, or why none."""
    gpu = attention_table.current_gpu()
    if gpu is None:
        return "no CUDA device: attention tables are per GPU, auto takes the first backend that serves a site"
    table = active_table()
    if table is not None:
        return f"measured table {table.describe()}"
    return f"{AUTO_ORDER[0]} (no measured table for {gpu[0]}; fixed order {', '.join(AUTO_ORDER)})"


# -- choosing per call -----------------------------------------------------------------------------------------


def backend_usable(name: str) -> bool:
    """Whether a table's backend name can be chosen here: registered, automatic, and available."""
    try:
        backend = get_backend(name)
    except ValueError:  # a name from another clip_flash version
        return False
    return backend.automatic and backend.status().available


class MeasuredAutoBackend(AttentionBackend):
    """``auto`` with a table: per call, the backend the table measured fastest for the call's shape.

    Serves one kind of site: ``dtype``, ``head_dim``, ``causal`` (the causal flag of each call still decides
    which entries apply). Falls back to ``sdpa`` (which serves everything) for explicit masks, dropout,
    cross-attention (tables time self-attention), tensors of another device or dtype than measured, and shapes
    with no entry. Everything about the table is digested at construction; a call costs one dict lookup once
    its shape has been seen, and deciding a new shape is pure Python on ints (no device sync, traceable by
    torch.compile, safe inside CUDA-graph capture).
    """

    kind = "auto"
    MAX_DECISIONS = 4096  # distinct shapes remembered; text cut/packed batches vary, so keep it bounded

    def __init__(self, table: AttentionTable, dtype: DtypeLike, head_dim: int, causal: bool,
                 device_type: str = "cuda", usable: Optional[Callable[[str], bool]] = None):
        usable = usable or backend_usable
        self.table = table
        self.dtype = _TORCH_DTYPES[dtype_name(dtype)]
        self.head_dim = head_dim
        self.device_type = device_type
        # It serves what its fallback serves: any call it cannot give a measured winner runs there.
        self.fallback = fallback_backend()
        self.limits, self.varlen_limits = self.fallback.limits, self.fallback.varlen_limits
        # Per (causal, varlen, replay): the entries' timings of backends usable here that serve such a call.
        self._shapes: Dict[Tuple[bool, bool, bool], List[TimedShape]] = {}
        for call_causal in (False, True):
            for varlen in (False, True):
                needs = AttentionNeeds(device_type=device_type, dtype=self.dtype, head_dim=head_dim,
                                       causal=call_causal, varlen=varlen)

                def serves(name: str, needs: AttentionNeeds = needs) -> bool:
                    if name not in _BACKENDS or not usable(name):  # the registry as it is now (tests add to it)
                        return False
                    return not get_backend(name).unsupported_reasons(needs)

                for replay in (False, True):
                    self._shapes[(call_causal, varlen, replay)] = [
                        timed for entry in table.kind_entries(self.dtype, call_causal, varlen, head_dim)
                        for timed in [_timed_shape(entry, serves, replay)] if timed.ms
                    ]
        # The backends chosen at some measured shape of this site's kind, most often first.
        self.winners: List[str] = winners([shape for varlen in (False, True) for replay in (False, True)
                                           for shape in self._shapes[(causal, varlen, replay)]])
        # patch() reports a site's backend by its name, so the name says what may run there.
        self.name = f"auto(measured: {'|'.join(self.winners) or self.fallback.name})"
        self._decisions: Dict[tuple, AttentionBackend] = {}

    def status(self) -> BackendStatus:
        return BackendStatus(self.name, True, version=torch.__version__)

    @property
    def supports_varlen(self) -> bool:
        return self.fallback.supports_varlen

    def decision(self, q: torch.Tensor, causal: bool, varlen: bool, batch: int, seq: int,
                 kv_seq: int) -> AttentionBackend:
        """The backend for a call with these shapes (and whether clip_flash is capturing it into a CUDA graph): computed
        once per distinct shape, then looked up."""
        replay = being_captured(q)
        key = (varlen, q.device.type, q.dtype, causal, batch, seq, kv_seq, q.shape[-2], q.shape[-1], replay)
        backend = self._decisions.get(key)
        if backend is None:
            backend = self._decide(q, causal, varlen, batch, seq, kv_seq, replay)
            if len(self._decisions) >= self.MAX_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = backend
        return backend

    def _decide(self, q: torch.Tensor, causal: bool, varlen: bool, batch: int, seq: int,
                kv_seq: int, replay: bool = False) -> AttentionBackend:
        if (q.device.type != self.device_type or q.dtype != self.dtype or q.shape[-1] != self.head_dim
                or kv_seq != seq):
            return self.fallback
        # A packed call's longest sequence says little of its cost: packed shapes are compared by count alone.
        name = choose_at(self._shapes[(bool(causal), varlen, replay)], q.shape[-2], batch, 1 if varlen else seq)
        if name is None:
            return self.fallback
        return runnable_on(get_backend(name), q)

    def attend(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        if attn_mask is not None or dropout_p > 0.0:  # tables time mask-free inference
            return self.fallback.attend(q, k, v, causal, attn_mask, dropout_p)
        backend = self.decision(q, causal, False, q.shape[0], q.shape[1], k.shape[1])
        return backend.attend(q, k, v, causal)

    def attend_varlen(self, q, k, v, cu_seqlens, max_seqlen, causal):
        backend = self.decision(q, causal, True, cu_seqlens.shape[0] - 1, max_seqlen, max_seqlen)
        return backend.attend_varlen(q, k, v, cu_seqlens, max_seqlen, causal)


def _timed_shape(entry: TableEntry, serves: Callable[[str], bool], replay: bool) -> TimedShape:
    """An entry's timings of the backends ``serves`` allows: its device times for a graph's replay where it has
    any of them, else its eager times."""
    device = {name: ms for name, ms in entry.device_ms.items() if ms is not None and serves(name)}
    eager = {name: ms for name, ms in entry.ms.items() if ms is not None and serves(name)}
    seq = 1 if entry.varlen else entry.seq
    return TimedShape(entry.heads, entry.batch, seq, device if replay and device else eager)


_for_replay = threading.local()


@contextlib.contextmanager
def choosing_for_replay() -> Iterator[None]:
    """Calls made in this block (on this thread) choose as a capture does, by device time. A graph's warm-up runs
    in it, so that the kernels the capture records have run before: a kernel's first call may set itself up in
    ways a capture forbids (cuDNN builds its plan for the shape), which would fail the capture."""
    previous = getattr(_for_replay, "on", False)
    _for_replay.on = True
    try:
        yield
    finally:
        _for_replay.on = previous


def being_captured(q: torch.Tensor) -> bool:
    """Whether this call warms up or is captured into one of clip_flash's CUDA graphs (then device time decides).

    Only the ``choosing_for_replay`` flag counts, not the stream's capture state: a graph someone captures
    themselves after eager warm-up calls must record the kernels those calls ran (a kernel first called inside a
    capture can fail it), and eager calls pay no CUDA query for the check."""
    return getattr(_for_replay, "on", False) and q.is_cuda and not torch.compiler.is_compiling()


def measured_backend(needs: AttentionNeeds) -> Optional[MeasuredAutoBackend]:
    """The measured ``auto`` backend for a site, or None when no table for this GPU covers it.

    Covered means: a CUDA site without a per-call explicit mask, a table that applies to the current GPU (and
    the site's capability), with entries of the site's dtype, head dim and causality, and sdpa (the fallback)
    able to serve the site. Sites of one kind share one backend, and so its per-shape decisions.
    """
    if needs.device_type != "cuda" or needs.explicit_mask or needs.varlen or needs.dtype not in _TABLE_DTYPES:
        return None
    table = active_table()
    if table is None:
        return None
    if needs.capability is not None and table.capability is not None and tuple(needs.capability) != table.capability:
        return None
    if not table.has_site(needs.dtype, needs.head_dim, needs.causal):
        return None
    if fallback_backend().unsupported_reasons(needs):
        return None
    key = (id(table), dtype_name(needs.dtype), needs.head_dim, needs.causal)
    with _lock:
        backend = _site_backends.get(key)
        if backend is None or backend.table is not table:
            backend = MeasuredAutoBackend(table, needs.dtype, needs.head_dim, needs.causal)
            _site_backends[key] = backend
    # Entries whose timed backends are all unavailable here leave nothing to choose from.
    return backend if backend.winners else None


__all__ = ["MeasuredAutoBackend", "being_captured", "choosing_for_replay", "describe_auto_choice", "backend_usable",
           "measured_backend"]
