"""The packed batch the CUDA kernel reads is right, checked without a GPU.

``emulate_kernel`` takes the kernel's arguments, as ``resample_packed`` slices them out of the one uploaded
buffer, and walks them exactly as ``csrc/image_resample.cu`` does (meta rows,
table offsets, output-row tiles, the tile's source-row window, per-row accumulators, the vertical-first
shared-memory chunks, padding, one-channel replication, the value table) in numpy, and must give
``preprocess(pil)`` for every image. A kernel bug in CUDA-specific code is left to the GPU tests; a bug
in the layout or in the algorithm's bookkeeping shows up here.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from clip_flash.inputs.image.transform_spec import spec_from_preprocess
import clip_flash.ops.image_resample as image_resample_module
from clip_flash.ops.image_resample import META_FIELDS, plan_batch


PRECISION_BITS = 22
ROUNDING = 1 << (PRECISION_BITS - 1)
ROWS_PER_BLOCK = 16  # kRowsPerBlock in the kernel
INT32 = 2**31


def _clip8(sums: np.ndarray) -> np.ndarray:
    assert np.abs(sums).max(initial=0) < INT32, "an int32 sum would overflow"
    return np.clip(sums >> PRECISION_BITS, 0, 255)


def _axis(tables: np.ndarray, offset: int, outputs: int, taps: int):
    start = tables[offset: offset + outputs].astype(np.int64)
    count = tables[offset + outputs: offset + 2 * outputs].astype(np.int64)
    weights = tables[offset + 2 * outputs: offset + 2 * outputs + outputs * taps].astype(np.int64)
    weights = weights.reshape(outputs, taps)
    return start, count, weights


def _premultiplied(px: np.ndarray, channels: int, premultiply: bool) -> np.ndarray:
    """The source pixels as the kernel reads them: RGBA colours times alpha / 255, Pillow's rounding."""
    if not premultiply:
        return px
    usable = px[: px.size // channels * channels].reshape(-1, channels).astype(np.int64)
    t = usable[:, :3] * usable[:, 3:] + 128
    usable[:, :3] = (t + (t >> 8)) >> 8
    return usable.reshape(-1)


def _finish(acc: np.ndarray, premultiply: bool) -> np.ndarray:
    values = _clip8(acc + ROUNDING)
    if premultiply:  # Pillow's RGBa -> RGBA
        alpha = values[..., 3:]
        divided = np.minimum(values[..., :3] * 255 // np.maximum(alpha, 1), 255)
        values[..., :3] = np.where((alpha == 0) | (alpha == 255), values[..., :3], divided)
    return values


def _horizontal_first_tile(px, width, channels, rows, cols, row0, row_end, out_w, tile_rows, premultiply):
    row_start, row_count, row_weights = rows
    col_start, col_count, col_weights = cols
    here = min(tile_rows, row_end - row0)
    ys, yc = row_start[row0: row0 + here], row_count[row0: row0 + here]
    used = yc > 0
    first = ys[used].min() if used.any() else 0
    last = (ys + yc)[used].max() if used.any() else 0
    acc = np.zeros((here, out_w, channels), dtype=np.int64)
    taps = np.arange(col_weights.shape[1])
    inside = taps[None, :] < col_count[:, None]
    for j in range(first, last):
        index = (j * width + col_start[:, None] + np.where(inside, taps[None, :], 0)) * channels
        values = px[index[:, :, None] + np.arange(channels)].astype(np.int64)
        h = _clip8(ROUNDING + (values * np.where(inside, col_weights, 0)[:, :, None]).sum(axis=1))
        for r in range(here):
            tap = j - ys[r]
            if 0 <= tap < yc[r]:
                acc[r] += h * row_weights[row0 + r, tap]
    padded = (yc[:, None] == 0) | (col_count[None, :] == 0)
    return padded, _finish(acc, premultiply)


def _vertical_first_tile(px, width, channels, rows, cols, row0, out_h, out_w, col_first, col_last, chunk_columns,
                         premultiply):
    row_start, row_count, row_weights = rows
    col_start, col_count, col_weights = cols
    here = min(ROWS_PER_BLOCK, out_h - row0)
    values = np.zeros((here, out_w, channels), dtype=np.int64)
    for r in range(here):
        y = row0 + r
        acc = np.zeros((out_w, channels), dtype=np.int64)
        if row_count[y] > 0:
            for chunk_first in range(col_first, col_last, chunk_columns):
                q = np.arange(min(chunk_columns, col_last - chunk_first) * channels)
                sums = np.full(q.shape, ROUNDING, dtype=np.int64)
                for t in range(row_count[y]):
                    at = (row_start[y] * width + chunk_first) * channels + t * width * channels + q
                    sums += px[at].astype(np.int64) * row_weights[y, t]
                chunk = _clip8(sums)
                first_tap = np.maximum(0, chunk_first - col_start)
                end_tap = np.minimum(col_count, chunk_first + chunk_columns - col_start)
                for t in range(col_weights.shape[1]):
                    use = (t >= first_tap) & (t < end_tap)
                    at = np.where(use, (col_start + t - chunk_first) * channels, 0)
                    picked = chunk[at[:, None] + np.arange(channels)]
                    acc += np.where(use[:, None], picked * col_weights[:, t][:, None], 0)
        values[r] = _finish(acc, premultiply)
    padded = (row_count[row0: row0 + here][:, None] == 0) | (col_count[None, :] == 0)
    return padded, values


def emulate_kernel(pixels, meta, tables, lut, out, chunk_columns: int = 4096) -> None:
    """``clip_flash._C.image_resample(pixels, meta, tables, lut, out)`` in numpy (same arguments)."""
    pixels, tables = pixels.numpy(), tables.numpy()
    n, _, out_h, out_w = out.shape
    field = {name: i for i, name in enumerate(META_FIELDS)}
    for image in range(n):
        m = {name: int(meta[image, i]) for name, i in field.items()}
        channels, premultiply = m["channels"], bool(m["premultiply"])
        size = m["height"] * m["width"] * channels  # the image's own bytes (the kernel reads no further)
        px = _premultiplied(pixels[m["pixel_offset"]: m["pixel_offset"] + size], channels, premultiply)
        rows = _axis(tables, m["rows_table"], out_h, m["row_taps"])
        cols = _axis(tables, m["cols_table"], out_w, m["col_taps"])
        for row0 in range(0, out_h, ROWS_PER_BLOCK):
            row_end = min(row0 + ROWS_PER_BLOCK, out_h)
            if m["vertical_first"]:
                tiles = [_vertical_first_tile(px, m["width"], channels, rows, cols, row0, out_h, out_w,
                                              m["col_first"], m["col_last"], chunk_columns, premultiply)]
            else:  # four channels: half-height sub-tiles, as the kernel does
                step = ROWS_PER_BLOCK // 2 if channels == 4 else ROWS_PER_BLOCK
                tiles = [_horizontal_first_tile(px, m["width"], channels, rows, cols, first, row_end, out_w, step,
                                                premultiply) for first in range(row0, row_end, step)]
            padded = np.concatenate([t[0] for t in tiles])
            values = np.where(padded[:, :, None], m["fill"], np.concatenate([t[1] for t in tiles]))
            for c in range(3):
                plane = torch.from_numpy(values[:, :, c if channels >= 3 else 0])
                out[image, c, row0: row0 + plane.shape[0]] = lut[c][plane]


class EmulatedExtension:
    """Stands in for ``clip_flash._C`` so ``resample_packed``'s upload and views run on the CPU."""

    def __init__(self, chunk_columns: int) -> None:
        self.chunk_columns = chunk_columns

    def image_resample(self, pixels, meta, tables, lut, out) -> None:
        assert pixels.dtype == torch.uint8 and meta.dtype == torch.int64 and tables.dtype == torch.int32
        assert lut.shape == (3, 256) and lut.dtype == out.dtype and out.is_contiguous()
        emulate_kernel(pixels, meta, tables, lut, out, self.chunk_columns)


@pytest.mark.parametrize("mode, chunk_columns",
                         [("shortest", 4096), pytest.param("longest", 4096, marks=pytest.mark.slow),
                          pytest.param("squash", 4096, marks=pytest.mark.slow), ("squash", 7)])
def test_emulated_kernel_on_packed_batch_is_exact(mode, chunk_columns, corpora, monkeypatch):
    """Small chunks make the vertical-first rows span many shared-memory chunks."""
    from open_clip.transform import image_transform

    preprocess = image_transform((96, 128), is_train=False, resize_mode=mode, fill_color=50)
    spec = spec_from_preprocess(preprocess)
    sizes = [(400, 90), (300, 200), (90, 400), (96, 128), (97, 127), (1, 1), (3, 2), (1, 40), (40, 1), (500, 60),
             (61, 700), (200, 150)]
    arrays = [corpora.random_image(h, w, c, seed=h * 3 + w + c) for h, w in sizes for c in (1, 3)]
    arrays += [corpora.with_alpha(corpora.random_image(h, w, 3, seed=h), seed=w) for h, w in sizes]
    arrays += [photo for _, photo in corpora.photos((96, 128))[::9]]
    accepted = [a for a in arrays if not isinstance(corpora.reference(preprocess, a), Exception)]
    plan = plan_batch([a.shape for a in accepted], spec)
    assert plan.meta[:, META_FIELDS.index("vertical_first")].any() or mode != "squash"
    buffer = plan.allocate_host(pin=False)
    for index, array in enumerate(accepted):
        plan.pixel_slot(buffer, index).copy_(torch.tensor(array))
    monkeypatch.setattr(image_resample_module, "load_extension", lambda: EmulatedExtension(chunk_columns))
    reference = torch.stack([preprocess(corpora.to_pil(a)) for a in accepted])
    for dtype in (torch.float32, torch.bfloat16):
        got = image_resample_module.resample_packed(buffer, plan, "cpu", dtype)
        bad = [i for i in range(len(accepted)) if not torch.equal(got[i], reference[i].to(dtype))]
        assert not bad, [accepted[i].shape for i in bad]


def test_plan_batch_shares_tables_and_names_bad_images(corpora):
    from open_clip.transform import image_transform

    from clip_flash.inputs.image.resample_plan import ImageTooSmallError

    spec = spec_from_preprocess(image_transform(224, is_train=False, resize_mode="longest"))
    plan = plan_batch([(480, 640, 3)] * 5 + [(480, 640, 1), (480, 640, 4), (224, 224, 4)], spec)
    assert len(set(plan.meta[:7, META_FIELDS.index("cols_table")])) == 1  # one table for seven images
    assert plan.total_bytes == plan.pixels_at + 5 * 480 * 640 * 3 + 480 * 640 + 480 * 640 * 4 + 224 * 224 * 4
    assert list(plan.meta[:, META_FIELDS.index("premultiply")]) == [0] * 6 + [1, 0]  # 224x224 is not resized
    with pytest.raises(ImageTooSmallError, match="image 1"):
        plan_batch([(480, 640, 3), (1, 1000, 3)], spec)
    with pytest.raises(ValueError, match="channels"):
        plan_batch([(10, 10, 2)], spec)


def test_plans_of_small_batches_are_shared_read_only_and_their_head_is_the_layout():
    """A small batch's plan comes from the cache (the same object for the same sizes and transform), cannot be
    written (a shared plan changed by one caller would resize another's batch wrongly), and its ``head`` is the
    meta rows and tap tables at their offsets; a batch past ``PLAN_CACHE_IMAGES`` is planned afresh."""
    from open_clip.transform import image_transform

    spec = spec_from_preprocess(image_transform(224, is_train=False))
    other = spec_from_preprocess(image_transform(336, is_train=False))
    shapes = [(480, 640, 3), (300, 200, 1)]
    plan = plan_batch(shapes, spec)
    assert plan_batch([tuple(shape) for shape in shapes], spec) is plan
    assert plan_batch(shapes, other) is not plan and plan_batch(shapes[:1], spec) is not plan
    with pytest.raises(ValueError, match="read-only"):
        plan.meta[0, 0] = 1
    with pytest.raises(ValueError, match="read-only"):
        plan.tables[0] = 1
    head = plan.head
    assert head.size == plan.pixels_at and not head.flags.writeable
    assert np.array_equal(head[: plan.meta.nbytes].view(np.int64).reshape(plan.meta.shape), plan.meta)
    assert np.array_equal(head[plan.tables_at: plan.tables_at + plan.tables.nbytes].view(np.int32), plan.tables)
    buffer = plan.allocate_host(pin=False, pixel_bytes=0)
    assert torch.equal(buffer, torch.from_numpy(head.copy()))
    many = [(480, 640, 3)] * (image_resample_module.PLAN_CACHE_IMAGES + 1)
    assert plan_batch(many, spec) is not plan_batch(many, spec)


def test_a_plan_is_the_same_whether_its_sizes_were_planned_before_or_not():
    """Each size is planned once per process (its meta row and its tables, packed once): a batch planned with
    that cache cold and again with it warm has the same layout, and the packed tables cannot be written."""
    from open_clip.transform import image_transform

    spec = spec_from_preprocess(image_transform(224, is_train=False))
    shapes = [(480, 640, 3), (300, 200, 1), (480, 640, 3), (375, 500, 3), (500, 375, 4)] * 20  # > the plan cache
    image_resample_module._shape_plan.cache_clear()
    cold = plan_batch(shapes, spec)
    warm = plan_batch(shapes, spec)
    assert cold is not warm and image_resample_module._shape_plan.cache_info().hits >= 4
    assert np.array_equal(cold.meta, warm.meta) and np.array_equal(cold.tables, warm.tables)
    assert (cold.tables_at, cold.pixels_at, cold.total_bytes) == (warm.tables_at, warm.pixels_at, warm.total_bytes)
    table = image_resample_module._shape_plan(480, 640, 3, spec).cols
    assert table.packed is table.packed and table.packed.dtype == np.int32
    with pytest.raises(ValueError, match="read-only"):
        table.packed[0] = 1


def test_resample_batch_falls_back_to_the_cpu(corpora):
    """Without CUDA (or for the CPU device) resample_batch is the CPU implementation, still exact."""
    from open_clip.transform import image_transform

    from clip_flash.ops.image_resample import resample_batch

    preprocess = image_transform(224, is_train=False)
    spec = spec_from_preprocess(preprocess)
    arrays = [corpora.random_image(300, 400, 3, seed=1), corpora.random_image(50, 20, 1, seed=2)]
    got = resample_batch([torch.from_numpy(a) for a in arrays], spec, device="cpu", dtype=torch.float16)
    reference = torch.stack([preprocess(corpora.to_pil(a)) for a in arrays]).to(torch.float16)
    assert torch.equal(got, reference)
    with pytest.raises(ValueError):
        resample_batch([torch.from_numpy(arrays[0])], spec, device="cpu", dtype=torch.int8)
