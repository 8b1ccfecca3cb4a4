"""The page-locked blocks made before a job's run are the ones its batches then take from torch's cache."""
from __future__ import annotations

import pytest
import torch

from clip_flash.jobs.pinned_reserve import PinnedReservation, coefficient_block_bytes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _blocks_made() -> int:
    return int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))


def test_a_batch_after_the_reservation_makes_no_new_block():
    size = coefficient_block_bytes(8)
    if size is None:
        pytest.skip("the native decoder is not built here")
    assert size >= 8 * 640 * 480  # a 640x480 4:2:0 JPEG holds 1.5 coefficients per pixel, 2 bytes each
    torch.zeros(1, device="cuda")
    before = _blocks_made()
    reservation = PinnedReservation(8, count=3).start()
    reservation.join()
    assert reservation.blocks_made == 3 and _blocks_made() == before + 3
    held = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(3)]  # as three batches would
    assert all(block.is_pinned() for block in held)
    assert _blocks_made() == before + 3
