"""The backend registry and the dispatcher that picks a kernel per attention site.

``auto`` picks from measured numbers when a timing table for this GPU covers the site (see ``measured``):
per call, the backend measured fastest for the call's shape. Without one it takes the first backend of
``AUTO_ORDER`` that serves the site.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .base import AttentionBackend, AttentionNeeds, BackendStatus
from .flash_attn import FlashAttnBackend
from .measured import MeasuredAutoBackend, load_attention_table, measured_backend
from .reference import ReferenceBackend
from .sdpa import SdpaBackend

__all__ = [
    "AttentionBackend", "AttentionNeeds", "BackendStatus", "BackendUnavailableError",
    "available_backends", "get_backend", "choose_backend", "BACKEND_NAMES", "AUTO_ORDER",
    "MeasuredAutoBackend", "load_attention_table",
]

_BACKENDS: Dict[str, AttentionBackend] = {
    backend.name: backend
    for backend in (
        SdpaBackend(), FlashAttnBackend(), ReferenceBackend(),
        SdpaBackend("cudnn"), SdpaBackend("flash"), SdpaBackend("efficient"), SdpaBackend("math"),
    )
}
BACKEND_NAMES: Tuple[str, ...] = tuple(_BACKENDS)

# Without a measured table for this GPU, ``auto`` tries these in order and takes the first that serves the
# site. SDPA comes first: on the H100, torch's cuDNN attention measured 0.46 ms against 0.64 ms for FA2 on
# ViT-L-14's (256x16x257x64) shape (../shared/design.md), and SDPA serves every device and dtype. The
# reference backend is never automatic.
AUTO_ORDER: Tuple[str, ...] = ("sdpa", "flash_attn")


class BackendUnavailableError(RuntimeError):
    """A backend the user asked for by name cannot run here; the message says which and why."""


def get_backend(name: str) -> AttentionBackend:
    """The backend registered under ``name`` (see ``BACKEND_NAMES``)."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; choose 'auto' or one of {list(BACKEND_NAMES)}") from None


def available_backends() -> Dict[str, BackendStatus]:
    """Every registered backend and whether it can run on this machine (with the reason when not)."""
    return {name: backend.status() for name, backend in _BACKENDS.items()}


def choose_backend(requested: str, needs: AttentionNeeds) -> Tuple[Optional[AttentionBackend], Dict[str, List[str]]]:
    """The backend that serves ``needs`` (``None`` if none does) and, per backend tried, why it could not.

    ``auto`` returns a ``MeasuredAutoBackend`` when a timing table for this GPU has entries for the site's
    dtype, head dim and causality; otherwise the first backend of ``AUTO_ORDER`` that serves the site.
    """
    if requested == "auto":
        measured = measured_backend(needs)
        if measured is not None:
            return measured, {}
    candidates = AUTO_ORDER if requested == "auto" else (requested,)
    rejected: Dict[str, List[str]] = {}
    for name in candidates:
        backend = get_backend(name)
        reasons = backend.unsupported_reasons(needs)
        if not reasons:
            return backend, rejected
        rejected[name] = reasons
    return None, rejected


def require_available(requested: str) -> None:
    """Raise ``BackendUnavailableError`` when a backend forced by name cannot run on this machine."""
    if requested == "auto":
        return
    status = get_backend(requested).status()
    if not status.available:
        raise BackendUnavailableError(f"attention backend {requested!r} cannot run here: {status.reason}")
