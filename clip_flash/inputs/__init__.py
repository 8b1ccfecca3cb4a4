"""Inputs in: images and text turned into exactly what OpenCLIP's own transforms and tokenizer give.

Two wings: :mod:`clip_flash.inputs.image` (``ImagePreprocessor``) and :mod:`clip_flash.inputs.text`
(``get_tokenizer``). Importing this package imports neither; the names below load on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"ImagePreprocessor": ".image.preprocessor", "PreparedImages": ".image.preprocessor",
         "DecodedImages": ".image.preprocessor", "get_tokenizer": ".text.tokenizer"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
