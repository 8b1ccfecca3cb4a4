"""The page-locked blocks made before a job's run are the ones its batches then take from torch's cache."""
from __future__ import annotations

import pytest
import torch

from clip_flash.jobs.pinned_reserve import PinnedReservation, coefficient_block_bytes, ladder_sizes

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
    made = 3 + len(ladder_sizes(3))
    # Blocks an earlier test left in torch's cache are taken again rather than made: at most ``made`` are new.
    assert reservation.blocks_made == made and before <= _blocks_made() <= before + made
    reserved = _blocks_made()
    held = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(3)]  # as three batches would
    # and the run's smaller buffers, whatever their sizes in the ladder's range
    held += [torch.empty(bytes_, dtype=torch.uint8, pin_memory=True) for bytes_ in (300, 5000, 393216, 3 << 20,
                                                                                    20 << 20, 20 << 20, 20 << 20)]
    assert all(block.is_pinned() for block in held)
    assert _blocks_made() == reserved


def test_the_blocks_are_sized_by_the_first_images(tmp_path):
    from PIL import Image

    if coefficient_block_bytes(8) is None:
        pytest.skip("the native decoder is not built here")
    large = tmp_path / "large.jpg"
    Image.new("RGB", (1600, 1200), (90, 120, 200)).save(large, quality=90)
    # 1600x1200 4:2:0 holds 1.5 coefficients per pixel, 2 bytes each; 8 of them in one block, with the table
    sized = coefficient_block_bytes(8, [str(large)] * 3)
    assert sized >= 8 * 1600 * 1200 * 3 > coefficient_block_bytes(8)
    # what does not scan as a JPEG leaves the 640x480 estimate
    (tmp_path / "text.jpg").write_bytes(b"not an image")
    assert coefficient_block_bytes(8, [str(tmp_path / "text.jpg")]) == coefficient_block_bytes(8)
    reservation = PinnedReservation(8, count=1, first_images=lambda: [str(large)]).start()
    reservation.join()
    assert reservation.block_bytes == sized and reservation.blocks_made == 1 + len(ladder_sizes(1))
