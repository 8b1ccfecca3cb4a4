"""torch's ``scaled_dot_product_attention``: torch picks cuDNN / flash / efficient / math per call,
or the user pins one kernel (``sdpa:cudnn``, ``sdpa:flash``, ``sdpa:efficient``, ``sdpa:math``)."""
from __future__ import annotations

import contextlib
import threading
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .base import HALF_DTYPES, AttentionBackend, BackendStatus, Limits

try:  # torch >= 2.10 ships a flash-based variable-length attention
    from torch.nn.attention.varlen import varlen_attn as _torch_varlen_attn
except ImportError:  # pragma: no cover - older torch
    _torch_varlen_attn = None

_PINNABLE = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_CUDA = frozenset({"cuda"})

# sdpa_kernel() pins a kernel by setting process-wide flags and restores them on exit. Two threads pinning at
# once restore each other's flags, which can leave a pin in place for the whole process (every later SDPA call
# then fails with "No available kernel" where the pinned kernel does not apply). Every SDPA call clip_flash
# makes holds this lock while the flags are set, so its own calls never interleave; it is held only for the
# kernel launch.
_SDPA_FLAGS_LOCK = threading.RLock()


def _flag_accessors():
    """(getter, setter, SDPBackend) per SDPA kernel flag, as ``sdpa_kernel`` walks them.

    None when this torch lacks them (then the public ``sdpa_kernel`` is used).
    """
    names = getattr(torch.nn.attention, "_backend_names", None)  # {"cudnn": "CUDNN_ATTENTION", ...}
    try:
        return tuple((getattr(torch._C, f"_get_{name}_sdp_enabled"), getattr(torch._C, f"_set_sdp_use_{name}"),
                      getattr(SDPBackend, member)) for name, member in names.items())
    except (AttributeError, TypeError):
        return None


_FLAG_ACCESSORS = _flag_accessors()
# Per pinnable kernel, the value of each flag in _FLAG_ACCESSORS while it is pinned (worked out once, not per call).
_PINNED_FLAGS = {} if _FLAG_ACCESSORS is None else {
    name: [member == backend for _, _, member in _FLAG_ACCESSORS] for name, backend in _PINNABLE.items()
}


class _HeldFlags:
    """Hold the lock and, when pinned, ``sdpa_kernel([backend])``'s flags for the with-block; restore on exit.

    The flags set and restored are exactly sdpa_kernel's; this skips its per-call Python work (building and
    deduplicating lists, name lookups, a generator context), which at launch-bound batch sizes costs about as
    much as the attention kernel itself.
    """

    __slots__ = ("_wanted", "_previous")

    def __init__(self, pinned: Optional[str]):
        self._wanted = _PINNED_FLAGS[pinned] if pinned else None
        self._previous = None

    def __enter__(self) -> None:
        _SDPA_FLAGS_LOCK.acquire()
        if self._wanted is not None:
            try:
                self._previous = [get() for get, _, _ in _FLAG_ACCESSORS]
                for (_, set_flag, _), enabled in zip(_FLAG_ACCESSORS, self._wanted):
                    set_flag(enabled)
            except BaseException:
                self._restore()
                raise

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def _restore(self) -> None:
        try:
            if self._previous is not None:
                for (_, set_flag, _), enabled in zip(_FLAG_ACCESSORS, self._previous):
                    set_flag(enabled)
        finally:
            self._previous = None
            _SDPA_FLAGS_LOCK.release()


@contextlib.contextmanager
def _traced_flags(pinned: Optional[str]):
    # Traced: dynamo handles sdpa_kernel itself; a lock would break the graph.
    with sdpa_kernel([_PINNABLE[pinned]]) if pinned else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def _locked_sdpa_kernel(pinned: Optional[str]):
    with _SDPA_FLAGS_LOCK:
        with sdpa_kernel([_PINNABLE[pinned]]) if pinned else contextlib.nullcontext():
            yield


def _flags_held(pinned: Optional[str]):
    """A context that runs SDPA with ``pinned`` as the only enabled kernel (None: torch's choice), thread-safely."""
    if torch.compiler.is_compiling():
        return _traced_flags(pinned)
    if _FLAG_ACCESSORS is None:  # a torch without the flag accessors: the public context manager
        return _locked_sdpa_kernel(pinned)
    return _HeldFlags(pinned)


def single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA of one query a row ((B, H, 1, D) against (B, H, L, D)) by a kernel that gives the same bits call
    after call: on CUDA the memory-efficient one. Left to itself torch picks cuDNN there on an H200 (cuDNN 9.19),
    whose single-query kernel gave 4-12 of 256 rows other last bits from one call to the next, where the flash,
    efficient and math kernels gave none (benchmarks/results/h200x2/ray_repeatable_416d4f4/probes/)."""
    # the efficient kernel takes head dims in multiples of 8 (16-bit) or 4 (fp32); other towers keep torch's pick
    if not q.is_cuda or q.shape[-1] % (4 if q.dtype == torch.float32 else 8):
        return F.scaled_dot_product_attention(q, k, v)
    with _flags_held("efficient"):
        return F.scaled_dot_product_attention(q, k, v)


# What each pinned kernel serves (unpinned, torch picks among them: every device, dtype and mask).
_PINNED_LIMITS = {
    None: Limits("SDPA"),
    "cudnn": Limits("SDPA cudnn kernel", device_types=_CUDA, dtypes=HALF_DTYPES, explicit_mask=False),
    "flash": Limits("SDPA flash kernel", device_types=_CUDA, dtypes=HALF_DTYPES, explicit_mask=False,
                    max_head_dim=256, head_dim_multiple=8),
    "efficient": Limits("SDPA efficient kernel", device_types=_CUDA),
    "math": Limits("SDPA math kernel"),
}
# Packed batches run torch's varlen_attn whatever kernel is pinned (pinning does not apply to it).
_VARLEN_LIMITS = None if _torch_varlen_attn is None else Limits(
    "variable-length attention", device_types=_CUDA, dtypes=HALF_DTYPES, min_capability=(8, 0))


# Oldest GPU each CUDA kernel of SDPA runs on (torch's own hardware checks in its SDPA dispatch).
_MIN_CAPABILITY = {"cudnn": (8, 0), "flash": (8, 0), "efficient": (5, 0)}


def _cuda_kernel_unavailable(pinned: str) -> Optional[str]:
    """Why SDPA's ``pinned`` CUDA kernel cannot run on this machine, or None when it can."""
    if not torch.cuda.is_available():
        why = "this torch is a CPU-only build" if not torch.version.cuda else "no CUDA device is visible"
        return f"SDPA's {pinned} kernel needs a CUDA GPU: {why}"
    if pinned == "cudnn" and not torch.backends.cudnn.is_available():
        return "SDPA's cudnn kernel needs cuDNN, which this torch cannot load"
    if pinned == "flash" and not torch.backends.cuda.is_flash_attention_available():
        return "this torch was built without SDPA's flash kernel"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < _MIN_CAPABILITY[pinned]:
        need = "%d.%d" % _MIN_CAPABILITY[pinned]
        return f"SDPA's {pinned} kernel needs compute capability >= {need}, this GPU is sm_{major}{minor}"
    return None


class SdpaBackend(AttentionBackend):
    """Serves every site on every device and dtype (its math kernel is the universal fallback)."""

    varlen_limits = _VARLEN_LIMITS

    def __init__(self, pinned: Optional[str] = None):
        if pinned is not None and pinned not in _PINNABLE:
            raise ValueError(f"unknown SDPA kernel {pinned!r}; choose from {sorted(_PINNABLE)}")
        self.pinned = pinned
        self.name = "sdpa" if pinned is None else f"sdpa:{pinned}"
        self.limits = _PINNED_LIMITS[pinned]

    def status(self) -> BackendStatus:
        """``sdpa`` and ``sdpa:math`` run anywhere; the pinned CUDA kernels only where torch can launch them."""
        reason = _cuda_kernel_unavailable(self.pinned) if self.pinned in _MIN_CAPABILITY else None
        return BackendStatus(self.name, reason is None, reason, version=torch.__version__)

    def _context(self):
        return _flags_held(self.pinned)

    def attend(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        # (B, L, H, D) -> (B, H, L, D) views: SDPA takes strided inputs, as nn.MultiheadAttention does.
        with self._context():
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal,
            )
        return out.transpose(1, 2)

    def attend_varlen(self, q, k, v, cu_seqlens, max_seqlen, causal):
        if _torch_varlen_attn is None:
            raise RuntimeError("torch.nn.attention.varlen.varlen_attn is not available in this torch")
        return _torch_varlen_attn(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
            window_size=(-1, 0) if causal else (-1, -1),
        )
