"""clip_flash: OpenCLIP models, same embeddings, sooner.

    import clip_flash
    report = clip_flash.patch(model)     # in place; print(report) says what runs where
    clip_flash.unpatch(model)            # the stock model again, bit for bit
    with clip_flash.patched(model): ...
    clip_flash.embed("photos/", "out/", model="ViT-L-14")   # a whole collection, clip-retrieval's layout
    tokenizer = clip_flash.get_tokenizer("ViT-L-14")   # OpenCLIP's ids, computed faster
"""
from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, Dict

__version__ = "0.1.0"

# Each public name and the module that defines it, imported on first use: ``import clip_flash`` stays light (it
# does not import OpenCLIP, torchvision or the job), so processes and tools that need one wing pay only for it.
_PUBLIC_API: Dict[str, str] = {
    "patch": ".patching.patching", "unpatch": ".patching.patching", "patched": ".patching.patching",
    "is_patched": ".patching.patching", "patch_report": ".patching.patching",
    "PatchReport": ".patching.report", "SiteReport": ".patching.report",
    "BACKEND_NAMES": ".backends", "BackendStatus": ".backends", "BackendUnavailableError": ".backends",
    "GraphedEncoder": ".graphs",
    "ImagePreprocessor": ".inputs.image.preprocessor", "PreparedImages": ".inputs.image.preprocessor",
    "get_tokenizer": ".inputs.text.tokenizer",
    "embed": ".jobs",
}

__all__ = sorted(_PUBLIC_API) + ["available_backends", "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported by __getattr__
    from .backends import BACKEND_NAMES, BackendStatus, BackendUnavailableError  # noqa: F401
    from .graphs import GraphedEncoder  # noqa: F401
    from .inputs.image.preprocessor import ImagePreprocessor, PreparedImages  # noqa: F401
    from .inputs.text.tokenizer import get_tokenizer  # noqa: F401
    from .jobs import embed  # noqa: F401
    from .patching.patching import is_patched, patch, patch_report, patched, unpatch  # noqa: F401
    from .patching.report import PatchReport, SiteReport  # noqa: F401


def __getattr__(name: str) -> Any:
    module_name = _PUBLIC_API.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC_API))


def available_backends() -> "Dict[str, BackendStatus]":
    """Each attention backend and whether it can run on this machine; ``reason`` says why not."""
    from .backends import available_backends as backend_statuses

    return backend_statuses()
