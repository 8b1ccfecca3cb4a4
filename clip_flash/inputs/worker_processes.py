"""Decoding worker processes: how they start, and the tasks they run.

Starting processes is what costs: a spawned worker is a fresh interpreter that imports torch, torchvision
and clip_flash before its first image (seconds, times the workers, all at once). So workers come from a
fork server where there is one: a fresh interpreter (started by fork and exec, so no CUDA context is ever
inherited) that imports the decoding modules once (:data:`WORKER_MODULES`); each worker is a fork of it,
started in milliseconds with those modules already loaded. :func:`prestart` starts that server early (a
job calls it before loading its model). Where there is no fork server, workers are spawned. Never plain
fork: the calling process may hold a CUDA context.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import multiprocessing
import os
import threading
from typing import Any, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image

from .arena_regions import decode_into_region
from .background_load import note_imported
from .image_decoding import TORCHVISION_DECODERS, DecodedItem, DecodeOptions, decode_item, decode_items
from .pixel_arena import ArenaRef, attach

# Imported once by the fork server, so that every worker forked from it starts with them loaded. Each one
# that cannot be imported there is skipped (the worker then imports what it needs itself, as a spawned one).
# Not torchvision: it costs seconds to import on some hosts (torch._dynamo comes with it), and a worker needs
# its decoders only for PNGs and the JPEGs the GPU route declines (imported in the background on the first
# such file, Pillow decoding meanwhile: see image_decoding's ``in-caller`` route).
WORKER_MODULES = ("numpy", "torch", "PIL.Image", "PIL.JpegImagePlugin", "PIL.PngImagePlugin", __name__)
# Without a GPU there is no GPU route: every JPEG goes through torchvision's decoder, so the server imports it.
CPU_WORKER_MODULES = ("torchvision.io",)

_worker_options: Optional[DecodeOptions] = None  # set in each worker by init_process_worker


def process_start_method() -> str:
    """``forkserver`` where this platform has it (workers fork from a server holding the decoding modules),
    else ``spawn``; never ``fork`` (this process may hold a CUDA context)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


_preload_lock = threading.Lock()


def process_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context decoding workers start in; for a fork server, :data:`WORKER_MODULES` are
    added to what it preloads (a server already running keeps what it has: workers then import the rest), and
    the server is started with ``clip_flash``'s light import: it and the workers forked from it import the
    decoding modules, not the top-level API (see ``clip_flash/__init__``)."""
    method = process_start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        with _preload_lock:
            # The default list is ["__main__"] (the main script, imported under its guard); kept, then ours.
            current = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or [])
            modules = WORKER_MODULES if torch.cuda.is_available() else WORKER_MODULES + CPU_WORKER_MODULES
            wanted = current + [name for name in modules if name not in current]
            if wanted != current:
                context.set_forkserver_preload(wanted)
            forkserver.ensure_running()
    return context


def prestart() -> None:
    """Start the fork server now: it imports the decoding modules in its own process while this one goes on
    (a job calls this before loading its model). Returns at once; without a fork server, does nothing."""
    process_context()


@functools.lru_cache(maxsize=1)
def warm_up_jpeg() -> bytes:
    """A small JPEG whose decoding loads and initialises every step a worker runs on a photo."""
    pixels = np.arange(24 * 32 * 3, dtype=np.uint8).reshape(24, 32, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def warm_up_process(data: bytes) -> int:
    """In a worker process: one decode, so that the first real task pays nothing for a first use."""
    decode_item(-1, data, _worker_options)
    return os.getpid()


def init_process_worker(options: DecodeOptions) -> None:
    global _worker_options
    _worker_options = dataclasses.replace(options, in_worker=True)
    note_imported(TORCHVISION_DECODERS)  # where the fork server preloaded them (no GPU)
    torch.set_num_threads(1)


def decode_chunk_in_process(pairs: List[Tuple[int, Any]]) -> Tuple[Optional[torch.Tensor], List[DecodedItem],
                                                                     List[Tuple[int, int]]]:
    """Decode in a worker process; pixels travel as one packed buffer plus (offset, numel) per item."""
    buffer, items = decode_items(pairs, _worker_options, pack=True)
    spans = []
    for item in items:
        if item.pixels is not None and buffer is not None:
            offset = item.pixels.storage_offset()
            spans.append((offset, item.pixels.numel()))
            item.pixels = None
        else:
            spans.append((-1, 0))
    return buffer, items, spans


def decode_into_arena_in_process(pairs: List[Tuple[int, Any]], ref: ArenaRef, start: int, capacity: int
                                  ) -> Tuple[List[DecodedItem], List[int], List[int], int, int, int]:
    """In a worker process: only the bookkeeping travels back; pixels that did not fit go as shared tensors."""
    return decode_into_region(pairs, _worker_options, attach(ref)[start:start + capacity])
