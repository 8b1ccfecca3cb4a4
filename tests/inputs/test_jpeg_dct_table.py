"""The JPEG route's kernel table travels in the coefficients' copy (CPU: the copy is synchronous there, so a
table written after its copy was queued would be missing from the uploaded bytes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from clip_flash.inputs.image import jpeg_dct

# Reader layouts (height, width, components, then 7 fields a component): a 16x16 gray image and a 32x24 4:2:0 one.
GRAY = [16, 16, 1, 1, 1, 2, 2, 0, 0, 0]
COLOR = [24, 32, 3, 2, 2, 4, 3, 0, 0, 0, 1, 1, 2, 2, 1, 1, 1, 1, 1, 2, 2, 1, 1, 1]


def _batch(table_room: bool):
    sizes = [jpeg_dct._aligned(2 * 2 * 128), jpeg_dct._aligned(12 * 128 + 2 * 6 * 128)]
    coefficient_bytes = sum(sizes)
    room = jpeg_dct.table_bytes(2) if table_room else 0
    host = torch.arange(coefficient_bytes + room, dtype=torch.int64).remainder(251).to(torch.uint8)
    offsets = [0, sizes[0]]
    batch = jpeg_dct.plan_dct_batch([GRAY, COLOR], [(host, offsets)], coefficient_bytes if table_room else None)
    batch.place([0, 16 * 16])
    return batch, host, coefficient_bytes


def _uploaded(batch, monkeypatch):
    """(coefficients, table) as the launch hands them to the kernels (a stand-in for them), on the CPU."""
    seen = {}

    class Kernels:
        @staticmethod
        def jpeg_dct_to_pixels(coefficients, table, planes, pixels, max_blocks, max_pixels):
            seen["coefficients"], seen["table"] = coefficients.clone(), table
            return ""

    monkeypatch.setattr("clip_flash.ops._extension.load_extension", lambda: Kernels)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    batch.upload(torch.device("cpu"))(torch.empty(16 * 16 + 24 * 32 * 3, dtype=torch.uint8))
    return seen["coefficients"], seen["table"]


def test_the_table_goes_up_in_the_coefficients_copy(monkeypatch):
    batch, host, coefficient_bytes = _batch(table_room=True)
    expected_coefficients = host[:coefficient_bytes].clone()
    coefficients, table = _uploaded(batch, monkeypatch)
    # The copy took the coefficients unchanged, then the table with its pixel offsets placed; the kernels read
    # the table as a view of those bytes (no copy of its own).
    assert torch.equal(coefficients[:coefficient_bytes], expected_coefficients)
    uploaded_table = coefficients[coefficient_bytes:coefficient_bytes + batch.table.nbytes].view(torch.int64)
    assert uploaded_table.view(2, -1).tolist() == batch.table.tolist()
    assert table.storage_offset() * 8 == coefficient_bytes and table.tolist() == batch.table.tolist()
    assert table[:, 1].tolist() == [0, 256] and table[1, 2:5].tolist() == [24, 32, 3]


def test_without_room_the_table_is_copied_on_its_own(monkeypatch):
    batch, host, _ = _batch(table_room=False)
    before = host.clone()
    coefficients, table = _uploaded(batch, monkeypatch)
    assert torch.equal(host, before) and torch.equal(coefficients, before)  # nothing written into the buffer
    assert table.tolist() == batch.table.tolist()


def test_room_must_be_aligned_and_large_enough():
    host = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(ValueError, match="no room for the table"):
        jpeg_dct.plan_dct_batch([GRAY], [(host, [0])], table_room=1000)
    with pytest.raises(ValueError, match="no room for the table"):
        jpeg_dct.plan_dct_batch([GRAY], [(host, [0])], table_room=100)
    assert jpeg_dct.plan_dct_batch([GRAY], [(host, [0])], table_room=512).table_room == 512
    assert jpeg_dct.table_bytes(1) == 256 and np.dtype(np.int64).itemsize * jpeg_dct.TABLE_FIELDS == 232
