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
import os
from typing import Dict

# Worker processes of clip_flash's own pools (decoding, tokenizing) only need ``clip_flash.inputs``: their fork
# server is started with this set, so that it does not import OpenCLIP and everything it pulls in (19.6 s of
# imports on the GPU host, 4.4 s without), during which a job's first batches decode in threads.
WORKER_PROCESS_ENV = "CLIP_FLASH_WORKER_PROCESS"
if os.environ.get(WORKER_PROCESS_ENV) != "1":
    from .backends import BACKEND_NAMES, BackendStatus, BackendUnavailableError
    from .graphs import GraphedEncoder
    from .inputs.images import ImagePreprocessor, PreparedImages
    from .inputs.tokenizer import get_tokenizer
    from .jobs import embed
    from .patch.report import PatchReport, SiteReport
    # Last: binding the function ``patch`` replaces the subpackage ``clip_flash.patch`` as this package's attribute
    # (import its modules with ``from clip_flash.patch.<module> import ...``).
    from .patch.patching import is_patched, patch, patch_report, patched, unpatch

else:
    # Where a worker does use the top-level API after all (a process of the user's, forked from the same server),
    # each name is imported on first use.
    _WORKER_API = {
        "BACKEND_NAMES": ".backends", "BackendStatus": ".backends", "BackendUnavailableError": ".backends",
        "GraphedEncoder": ".graphs", "ImagePreprocessor": ".inputs.images",
        "PreparedImages": ".inputs.images", "get_tokenizer": ".inputs.tokenizer", "embed": ".jobs",
        "PatchReport": ".patch.report", "SiteReport": ".patch.report", "is_patched": ".patch.patching",
        "patch": ".patch.patching", "patch_report": ".patch.patching", "patched": ".patch.patching",
        "unpatch": ".patch.patching",
    }

    def __getattr__(name: str):
        if name not in _WORKER_API:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        module = importlib.import_module(_WORKER_API[name], __name__)
        value = getattr(module, name)
        globals()[name] = value  # after the import, which bound the subpackage ``patch`` here
        return value

__version__ = "0.1.0"
__all__ = [
    "patch", "unpatch", "patched", "is_patched", "patch_report", "available_backends", "GraphedEncoder",
    "ImagePreprocessor", "PreparedImages", "get_tokenizer", "embed",
    "PatchReport", "SiteReport", "BackendStatus", "BackendUnavailableError", "BACKEND_NAMES", "__version__",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())


def available_backends() -> Dict[str, BackendStatus]:
    """Each attention backend and whether it can run on this machine; ``reason`` says why not."""
    from .backends import available_backends as backend_statuses

    return backend_statuses()
