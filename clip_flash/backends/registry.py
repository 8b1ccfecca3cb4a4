"""The attention backends by name, and the order ``auto`` tries them in when no measured table applies."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from .base import AttentionBackend, BackendStatus
from .flash_attn import FlashAttnBackend
from .reference import ReferenceBackend
from .sdpa import SdpaBackend

_BACKENDS: Dict[str, AttentionBackend] = {
    backend.name: backend
    for backend in (
        SdpaBackend(), FlashAttnBackend(), ReferenceBackend(),
        SdpaBackend("cudnn"), SdpaBackend("flash"), SdpaBackend("efficient"), SdpaBackend("math"),
    )
}
BACKEND_NAMES: Tuple[str, ...] = tuple(_BACKENDS)

# Without a measured table for this GPU, ``auto`` tries these in order and takes the first that serves the
# site. SDPA comes first: torch's cuDNN attention is faster than FA2 on ViT-L-14's attention shape (the shipped
# tables in attention_tables/), and SDPA serves every device and dtype. The reference backend is never automatic.
AUTO_ORDER: Tuple[str, ...] = ("sdpa", "flash_attn")
FALLBACK = "sdpa"


class BackendUnavailableError(RuntimeError):
    """A backend the user asked for by name cannot run here; the message says which and why."""


def get_backend(name: str) -> AttentionBackend:
    """The backend registered under ``name`` (see ``BACKEND_NAMES``)."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; choose 'auto' or one of {list(BACKEND_NAMES)}") from None


def fallback_backend() -> AttentionBackend:
    """SDPA, which serves every call (any device, dtype and mask): where a chosen backend cannot run a call."""
    return _BACKENDS[FALLBACK]


def runnable_on(backend: AttentionBackend, q: torch.Tensor) -> AttentionBackend:
    """``backend`` when it takes ``q``'s device and dtype (they may have changed since patching), else SDPA."""
    return backend if backend.accepts(q) else _BACKENDS[FALLBACK]


def available_backends() -> Dict[str, BackendStatus]:
    """Every registered backend and whether it can run on this machine (with the reason when not)."""
    return {name: backend.status() for name, backend in _BACKENDS.items()}


def require_available(requested: str) -> None:
    """Raise ``BackendUnavailableError`` when a backend forced by name cannot run on this machine."""
    if requested == "auto":
        return
    status = get_backend(requested).status()
    if not status.available:
        raise BackendUnavailableError(f"attention backend {requested!r} cannot run here: {status.reason}")
