"""Attention backends: what each kernel serves (``base``, one module per kernel), the registry by name
(``registry``), measured tables (``attention_table``) and the per-call choice from them (``measured``), and the
choice per site (``dispatch``)."""
from __future__ import annotations

from .attention_table import AttentionTableError, clear_attention_tables, load_attention_table
from .base import AttentionBackend, AttentionNeeds, BackendStatus, Limits
from .dispatch import choose_backend
from .measured import MeasuredAutoBackend, choosing_for_replay
from .registry import (
    AUTO_ORDER, BACKEND_NAMES, BackendUnavailableError, available_backends, fallback_backend, get_backend,
    require_available, runnable_on,
)

__all__ = [
    "AttentionBackend", "AttentionNeeds", "BackendStatus", "Limits", "BackendUnavailableError",
    "available_backends", "get_backend", "choose_backend", "require_available", "BACKEND_NAMES", "AUTO_ORDER",
    "fallback_backend", "runnable_on", "MeasuredAutoBackend", "load_attention_table", "clear_attention_tables",
    "AttentionTableError", "choosing_for_replay",
]
