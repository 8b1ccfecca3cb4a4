"""What a decoding worker process loads only when first needed, in the background, so that no batch waits for it.

Workers fork from a server that preloads only what every image needs (see :mod:`.worker_processes`). Two things
cost seconds to tens of seconds to load on a busy GPU host and are needed for some images only: OpenCLIP's
transform (unpickling it imports OpenCLIP and torchvision; the images Pillow resizes its own way need it) and
torchvision's CPU decoders (PNGs, JPEGs the GPU route declines). A worker that meets such an image starts
loading what it lacks here and, meanwhile, takes a route that computes the same thing without it (see
:mod:`.image_decoding`: Pillow decodes, or the image goes back to the caller).

Everything loads on one daemon thread, one thing after another: two threads importing torchvision at once
failed halfway through its circular imports on the GPU host ("partially initialized module").
"""
from __future__ import annotations

import functools
import importlib
import logging
import pickle
import queue
import sys
import threading
from typing import Any, Callable, Dict, Optional

import torch
from PIL import Image

logger = logging.getLogger(__name__)

_work: "queue.SimpleQueue[Callable[[], Any]]" = queue.SimpleQueue()
_thread: Optional[threading.Thread] = None
_thread_lock = threading.Lock()
_imports_done: Dict[str, threading.Event] = {}
_imports_lock = threading.Lock()


def run_in_background(work: Callable[[], Any]) -> None:
    """Run ``work`` on this process's loading thread (started on first use), after the work queued before it."""
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.is_alive():  # none yet, or a fork's copy of a parent's
            _thread = threading.Thread(target=_serve, name="clip_flash-background-load", daemon=True)
            _thread.start()
    _work.put(work)


def _serve() -> None:
    while True:
        work = _work.get()
        try:
            work()
        except Exception as error:  # noqa: BLE001 - what failed to load is never used: its fallback stays
            logger.warning("loading in the background failed (%s: %s); the slower route that does without it "
                           "stays in use", type(error).__name__, error)


def imported_in_background(module: str) -> bool:
    """Whether ``module`` has been imported here; the first call queues its import and returns False. (A module
    merely present in ``sys.modules`` may still be running its body in another thread; using it would wait.)"""
    with _imports_lock:
        done = _imports_done.get(module)
        if done is None:
            done = _imports_done[module] = threading.Event()
            run_in_background(functools.partial(_import_then_set, module, done))
    return done.is_set()


def note_imported(module: str) -> None:
    """Record ``module`` as imported if it is in ``sys.modules``: call it where no other thread can be importing
    it, as a worker starts (the fork server imported it whole)."""
    if module in sys.modules:
        with _imports_lock:
            _imports_done.setdefault(module, threading.Event()).set()


def _import_then_set(module: str, done: threading.Event) -> None:
    try:
        importlib.import_module(module)  # a failure is logged; the module's user then fails where it imports it
    finally:
        done.set()


class DeferredTransform:
    """A transform that travels to worker processes as pickled bytes and is unpickled there when first needed.

    Unpickling OpenCLIP's transform imports OpenCLIP and torchvision (their modules define its steps): 10-18 s
    in each of 16 fresh workers at once on the GPU host. Workers need it only for the images the exact path
    hands to Pillow whole (RGBA, palette, CMYK...), so most never pay; one that does loads it in the background
    (:meth:`load_in_background`) and hands those images to the caller meanwhile (route ``in-caller``). Called
    before it has loaded, it loads in the calling thread."""

    def __init__(self, transform: Optional[Callable[[Image.Image], torch.Tensor]]) -> None:
        self._transform = transform
        self._pickled: Optional[bytes] = None
        self._lock = threading.Lock()
        self._queued = False

    @property
    def loaded(self) -> bool:
        return self._transform is not None

    def load_in_background(self) -> None:
        """Queue the unpickling on the loading thread (once)."""
        with self._lock:
            if self._transform is None and not self._queued:
                self._queued = True
                run_in_background(self._load)

    def _load(self) -> Callable[[Image.Image], torch.Tensor]:
        with self._lock:
            if self._transform is None:
                self._transform = pickle.loads(self._pickled)
            return self._transform

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return (self._transform or self._load())(image)

    def __getstate__(self) -> Dict[str, Any]:
        with self._lock:
            if self._pickled is None:  # once, not once per worker
                self._pickled = pickle.dumps(self._transform)
            return {"_pickled": self._pickled}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(None)
        self._pickled = state["_pickled"]
