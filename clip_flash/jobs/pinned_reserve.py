"""Page-locked host blocks for a job's image batches, made before its run, while its model loads.

The native decoder writes each batch's JPEG coefficients into one page-locked block from torch's allocator,
which caches a freed block for reuse (per power-of-two size) but makes each new one with ``cudaHostAlloc``.
Making one holds a lock of the CUDA driver: measured on an H100 host, a 256 MiB block takes ~100 ms, and
another thread's launch-and-sync round waited for all four blocks made meanwhile (514 ms;
``benchmarks/results/h100/job_start_63aab05/pinned_host.md``). Left to the run, the blocks are made during its
first batches (15-27 blocks, 0.45-1.23 s per run, measured) and stall the encoder and the warm-up with them.
:class:`PinnedReservation` makes them beforehand in a thread of its own, while the model is built on the CPU,
and frees them into the allocator's cache, where the run's batches find them.

The blocks are sized as the run's first batch asks for them: the job's first images are scanned (headers
only, in the reservation's thread) and their coefficient bytes, as the decoder lays them out, scaled to a full
batch. Where no images are given (or none scans as a JPEG), a batch of 640x480 4:2:0 JPEGs. Batches that need a
larger power-of-two size than the first make their blocks in the run as before: nothing else changes. With only those,
the runs measured still made 10-17 smaller blocks (0.10-0.36 s; ``job_start_63aab05/embed_bench_3b99e4f_{a,b}.md``):
the run's other page-locked buffers, whose sizes vary from batch to batch (the resize layout's head with the
pixels of the images decoded whole, the coefficient table, the output rows). So a ladder of blocks of every
power-of-two size from 256 bytes to 32 MiB is made too (``count`` of each up to 1 MiB, 3 of each above): about
200 MiB of page-locked memory, held in torch's cache for the job.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Sequence

import torch

from .beside_load import BesideModelLoad

logger = logging.getLogger(__name__)

LADDER_SMALLEST, LADDER_LARGEST = 256, 32 << 20  # bytes: the ladder's power-of-two block sizes
LADDER_MANY_UP_TO = 1 << 20  # up to this size, ``count`` blocks each; above it, LADDER_FEW_EACH
LADDER_FEW_EACH = 3


def coefficient_block_bytes(batch_size: int, images: Sequence[Any] = ()) -> Optional[int]:
    """Bytes the native decoder asks for to hold a batch of ``batch_size`` JPEGs' coefficients and the kernel's
    table: the batch of ``images`` (paths or encoded bytes, the job's first; scaled to ``batch_size``), else of
    640x480 4:2:0 JPEGs (None where the native decoder cannot run)."""
    from ..inputs.image.jpeg_dct import ALIGN, table_bytes
    from ..inputs.image.native_decode import COEFFICIENT_BYTES, KIND, DecodeKind, NativeBatchDecoder, ScanMode
    from .warm_up import synthetic_images

    decoder = NativeBatchDecoder.create(1)
    if decoder is None:
        return None
    sample = list(images[:batch_size]) or [synthetic_images()[0]]
    info = decoder.scan(sample, ScanMode.COEFFICIENTS).info
    taken = info[info[:, KIND] == DecodeKind.COEFFICIENTS, COEFFICIENT_BYTES]
    if not len(taken) and images:
        return coefficient_block_bytes(batch_size)
    if not len(taken):
        return None
    per_image = int((-(-taken.astype("int64") // ALIGN) * ALIGN).sum()) / len(taken)
    return int(per_image * batch_size) + table_bytes(batch_size)


def ladder_sizes(count: int) -> List[int]:
    """The ladder's block sizes, one entry per block: every power of two from LADDER_SMALLEST to LADDER_LARGEST,
    ``count`` times each up to LADDER_MANY_UP_TO and LADDER_FEW_EACH times above."""
    sizes, size = [], LADDER_SMALLEST
    while size <= LADDER_LARGEST:
        sizes += [size] * (count if size <= LADDER_MANY_UP_TO else min(count, LADDER_FEW_EACH))
        size *= 2
    return sizes


def first_images(shards: Sequence[Any], count: int) -> List[Any]:
    """The images (paths or encoded bytes) of up to ``count`` first items of ``shards`` (the run's first batch)."""
    images: List[Any] = []
    for shard in shards:
        for item in shard.load():
            if item.image is not None and item.error is None:
                images.append(item.image)
                if len(images) == count:
                    return images
    return images


class PinnedReservation(BesideModelLoad):
    """Makes ``count`` page-locked blocks for batches of ``batch_size``, and the ladder of smaller sizes, in a
    background thread, then frees them into torch's cache. ``start()`` it before the model load; ``join()``
    before the run (its blocks must not be made beside the run's first batches: that is the stall it removes).
    ``first_images``: a callable giving the job's first images (paths or bytes; called in the thread), which size
    the blocks."""

    thread_name = "clip_flash-pinned-reserve"

    def __init__(self, batch_size: int, count: int,
                 first_images: Optional[Callable[[], Sequence[Any]]] = None) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.count = count
        self.first_images = first_images
        self.block_bytes: Optional[int] = None
        self.blocks_made = 0

    def _work(self) -> None:
        size = coefficient_block_bytes(self.batch_size, self.first_images() if self.first_images else ())
        if size is None:
            return
        self.block_bytes = size
        blocks: List[torch.Tensor] = []
        for _ in range(self.count):
            blocks.append(torch.empty(size, dtype=torch.uint8, pin_memory=True))
        for rung in ladder_sizes(self.count):
            blocks.append(torch.empty(rung, dtype=torch.uint8, pin_memory=True))
        self.blocks_made = len(blocks)
        del blocks  # into the allocator's cache: no copy was queued from them, so they are free at once

    def _failed(self, error: Exception) -> None:
        # an optimisation: without it the run makes its own blocks
        logger.warning("page-locked blocks for the image batches were not made ahead: %s", error)

    def _finished(self) -> None:
        if self.blocks_made:
            logger.info("made %d page-locked blocks for batches of %d images in %.2f s, beside the model load",
                        self.blocks_made, self.batch_size, self.seconds)
