"""Which backend serves an attention site: the one asked for by name, or ``auto``'s choice.

``auto`` picks from measured numbers when a timing table for this GPU covers the site (``measured.py``):
per call, the backend measured fastest for the call's shape. Without one it takes the first backend of
``AUTO_ORDER`` that serves the site.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .base import AttentionBackend, AttentionNeeds
from .measured import measured_backend
from .registry import AUTO_ORDER, get_backend


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
