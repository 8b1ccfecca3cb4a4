"""Reusable host memory that decoding workers write pixels into, and the GPU uploads from.

Allocating and page-locking a few hundred megabytes for every batch costs more than decoding it, and
copying each decoded image once more in the calling process (after a process pool handed it back) costs
as much again. So a :class:`ArenaPool` keeps a few large arenas alive: each is a Linux ``memfd`` mapping
(which worker processes open through ``/proc/<pid>/fd``), page-locked once with ``cudaHostRegister``
when the pixels go to a GPU. A batch leases one arena; every decoding task gets its own region of it and
writes its images back to back there, so the pixels are copied exactly once after the decoder made them.

A lease ends when the last tensor viewing it is freed; the arena is then reused once the upload that
read it (:meth:`Lease.record_upload`) has finished on the GPU.
"""
from __future__ import annotations

import collections
import itertools
import logging
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Deque, List, Optional, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

INITIAL_BYTES_PER_IMAGE = 3 << 19  # 1.5 MiB: an 800x600 RGB photo; grows with what is seen
MAX_BYTES_PER_IMAGE = 8 << 20      # larger images are packed apart (a second upload), not given room here
ARENA_GRANULE = 64 << 20           # arena sizes are multiples of this, so similar batches reuse arenas
MAX_FREE_ARENAS = 4
_ids = itertools.count()

# (arena id, path other processes open, size): what a worker process needs to map an arena.
ArenaRef = Tuple[int, str, int]


def arenas_supported() -> bool:
    """Whether this platform has what arenas shared with worker processes need (Linux memfd)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


class Arena:
    """One memfd mapping, optionally page-locked for CUDA."""

    def __init__(self, size: int, pin: bool) -> None:
        self.id = next(_ids)
        self.size = size
        self.fd = os.memfd_create(f"clip_flash-pixels-{self.id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.pinned = False
        self.upload_done: Optional[torch.cuda.Event] = None
        if pin:
            code = int(torch.cuda.cudart().cudaHostRegister(self.array.ctypes.data, size, 0))
            self.pinned = code == 0
            if not self.pinned:
                logger.warning("cudaHostRegister of a %d MiB pixel arena failed (cudaError %d): uploads from it "
                               "are not asynchronous", size >> 20, code)

    def touch(self) -> None:
        """Give the mapping its memory now (one write per page), rather than in the first batch's workers."""
        self.array[::mmap.PAGESIZE] = 0

    @property
    def ref(self) -> ArenaRef:
        return self.id, f"/proc/{os.getpid()}/fd/{self.fd}", self.size

    def wait_for_upload(self) -> None:
        if self.upload_done is not None:
            self.upload_done.synchronize()
            self.upload_done = None

    def close(self) -> None:
        self.wait_for_upload()
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.array.ctypes.data)
            self.pinned = False
        self.array = None  # the mapping closes once no numpy view of it is left
        try:
            self.map.close()
        except BufferError:  # still viewed by a tensor somewhere: freed with it
            pass
        os.close(self.fd)


@dataclass
class Lease:
    """One batch's use of an arena: ``tensor`` views all of it; each task writes its own region."""

    arena: Arena
    tensor: torch.Tensor

    def record_upload(self) -> None:
        """Mark the end of the GPU copies that read this arena (on the current stream)."""
        if self.arena.pinned:
            event = torch.cuda.Event()
            event.record()
            self.arena.upload_done = event


class ArenaPool:
    """Arenas leased batch by batch, and reused; thread-safe."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.bytes_per_image = INITIAL_BYTES_PER_IMAGE
        self._free: Deque[Arena] = collections.deque()
        self._lock = threading.Lock()
        self._made_ahead = threading.Condition(self._lock)  # notified when reserve() adds an arena
        self._reserving = 0            # arenas reserve() is making now ...
        self._reserving_size = 0       # ... and their size
        self._closed = False

    def lease(self, images: int) -> Tuple[Lease, int]:
        """An arena with room for ``images`` images at the current allowance; returns it and the allowance."""
        per_image = self.bytes_per_image
        need = max(1, images) * per_image
        with self._lock:
            while True:
                fitting = [arena for arena in self._free if arena.size >= need]
                if fitting or self._closed or not (self._reserving and self._reserving_size >= need):
                    break
                # An arena being made ahead fits: wait for it rather than make (and page-lock) one more.
                self._made_ahead.wait()
            arena = min(fitting, key=lambda candidate: candidate.size) if fitting else None
            if arena is not None:
                self._free.remove(arena)
                retired = []
            else:  # arenas too small for batches this size are not kept page-locked
                retired = [candidate for candidate in self._free if candidate.size < need]
                self._free = collections.deque(candidate for candidate in self._free if candidate.size >= need)
                while len(self._free) >= MAX_FREE_ARENAS:
                    retired.append(self._free.popleft())
        for old in retired:
            old.close()
        if arena is None:
            size = -(-need // ARENA_GRANULE) * ARENA_GRANULE
            arena = Arena(size, self.pin)
            logger.debug("new %d MiB pixel arena (pinned: %s)", size >> 20, arena.pinned)
        arena.wait_for_upload()
        array = np.frombuffer(arena.map, dtype=np.uint8)  # this lease's own object: its lifetime is the lease's
        finalizer = weakref.finalize(array, self._release, arena)
        finalizer.atexit = False  # at exit the process frees it all; no CUDA calls from a dying interpreter
        return Lease(arena, torch.from_numpy(array)), per_image

    def reserve(self, images: int, count: int) -> int:
        """Make up to ``count`` arenas for batches of ``images`` now (page-locked when pinning, every page
        touched), so that the first batches find them ready; returns how many were made. Never more free
        arenas than are kept; arenas already free count."""
        need = max(1, images) * self.bytes_per_image
        size = -(-need // ARENA_GRANULE) * ARENA_GRANULE
        made = 0
        while made < count:
            with self._lock:
                if self._closed or len(self._free) >= min(count, MAX_FREE_ARENAS):
                    break
                self._reserving += 1
                self._reserving_size = size
            arena = None
            try:
                arena = Arena(size, self.pin)
                if not arena.pinned:
                    arena.touch()  # page-locking touched every page already
            finally:
                with self._lock:
                    self._reserving -= 1
                    keep = arena is not None and not self._closed and len(self._free) < MAX_FREE_ARENAS
                    if keep:
                        self._free.append(arena)
                    self._made_ahead.notify_all()
            if not keep:
                arena.close()
                break
            made += 1
        logger.debug("%d pixel arenas of %d MiB made ahead (pinned: %s)", made, size >> 20, self.pin)
        return made

    def observe(self, bytes_per_image: float) -> None:
        """A task needed this many bytes per image: give later batches that much room (and some)."""
        wanted = min(MAX_BYTES_PER_IMAGE, int(bytes_per_image * 1.25) + 4096)
        if wanted > self.bytes_per_image:
            with self._lock:
                self.bytes_per_image = max(self.bytes_per_image, wanted)

    def _release(self, arena: Arena) -> None:
        with self._lock:
            if not self._closed:
                self._free.append(arena)
                self._made_ahead.notify_all()  # a lease waiting for an arena made ahead may take this one
                return
        arena.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._made_ahead.notify_all()
            arenas, self._free = list(self._free), collections.deque()
        for arena in arenas:
            arena.close()


_attached: "collections.OrderedDict[int, Tuple[mmap.mmap, np.ndarray]]" = collections.OrderedDict()
MAX_ATTACHED = 8


def attach(ref: ArenaRef) -> np.ndarray:
    """In a worker process: the arena ``ref`` names, mapped once and kept (the last few). Where it cannot
    be opened, an empty array: every image then travels back apart, as if it did not fit (exact, slower)."""
    arena_id, path, size = ref
    if arena_id not in _attached:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as error:
            logger.warning("cannot open the pixel arena %s (%s): pixels travel back apart", path, error)
            return np.zeros(0, dtype=np.uint8)
        try:
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _attached[arena_id] = (mapping, np.frombuffer(mapping, dtype=np.uint8))
        while len(_attached) > MAX_ATTACHED:
            _attached.popitem(last=False)  # the mapping is unmapped when garbage collected
    _attached.move_to_end(arena_id)
    return _attached[arena_id][1]


def write_pixels(region: np.ndarray, pixels: List[Optional[torch.Tensor]]) -> Tuple[List[int], int, int]:
    """Copy each CPU tensor into ``region`` back to back while it fits; returns each one's offset (-1:
    not written, it did not fit or is not CPU pixels), the bytes written and the bytes all needed."""
    offsets, used, needed = [], 0, 0
    for image in pixels:
        if image is None or image.device.type != "cpu":
            offsets.append(-1)
            continue
        size = image.numel()
        needed += size
        if used + size > region.size:
            offsets.append(-1)
            continue
        np.copyto(region[used:used + size].reshape(tuple(image.shape)), image.numpy())
        offsets.append(used)
        used += size
    return offsets, used, needed


__all__ = ["Arena", "ArenaPool", "ArenaRef", "Lease", "arenas_supported", "attach", "write_pixels"]
