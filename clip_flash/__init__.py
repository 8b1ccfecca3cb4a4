"""clip_flash: OpenCLIP models, same embeddings, sooner.

    import clip_flash
    report = clip_flash.patch(model)     # in place; print(report) says what runs where
    clip_flash.unpatch(model)            # the stock model again, bit for bit
    with clip_flash.patched(model): ...
    clip_flash.embed("photos/", "out/", model="ViT-L-14")   # a whole collection, clip-retrieval's layout
    tokenizer = clip_flash.get_tokenizer("ViT-L-14")   # OpenCLIP's ids, computed faster
"""
from __future__ import annotations

import logging
from typing import Dict

from .backends import BACKEND_NAMES, BackendStatus, BackendUnavailableError
from .backends import available_backends as _available_backends
from .graphs import GraphedEncoder
from .inputs.images import ImagePreprocessor, PreparedImages
from .inputs.tokenizer import get_tokenizer
from .jobs import embed
from .patch.report import PatchReport, SiteReport
# Last: binding the function ``patch`` replaces the subpackage ``clip_flash.patch`` as this package's attribute
# (import its modules with ``from clip_flash.patch.<module> import ...``).
from .patch.patching import is_patched, patch, patch_report, patched, unpatch

__version__ = "0.1.0"
__all__ = [
    "patch", "unpatch", "patched", "is_patched", "patch_report", "available_backends", "GraphedEncoder",
    "ImagePreprocessor", "PreparedImages", "get_tokenizer", "embed",
    "PatchReport", "SiteReport", "BackendStatus", "BackendUnavailableError", "BACKEND_NAMES", "__version__",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())


def available_backends() -> Dict[str, BackendStatus]:
    """Each attention backend and whether it can run on this machine; ``reason`` says why not."""
    return _available_backends()
