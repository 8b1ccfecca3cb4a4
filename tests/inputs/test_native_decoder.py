"""The native batch decoder (``csrc/image_batch_decoder.cpp``): what it decodes whole is Pillow's pixels bit for
bit; what it is not sure of is left to Pillow, never decoded differently and never raised; its threads serve
calls from several Python threads. Skipped where the extension is not built (the Python threads then decode)."""
from __future__ import annotations

import io
import os
import random
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from clip_flash.inputs.image.native_decode import (CHANNELS, COEFFICIENT_BYTES, HEIGHT, KIND, WIDTH, DecodeKind,
                                                   NativeBatchDecoder, ScanMode)
from photo_corpus import skimage_photo

NATIVE = NativeBatchDecoder.create(threads=3)
pytestmark = pytest.mark.skipif(NATIVE is None, reason="clip_flash._C with the batch decoder is not built here")


def _pillow(data: bytes):
    """Pillow's mode and pixels (H, W, C) of ``data``, or the exception's type name."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as error:  # noqa: BLE001 - the reference's failure
        return type(error).__name__, None
    array = np.asarray(image)
    return image.mode, array[:, :, None] if array.ndim == 2 else array


def _decode_whole(datas):
    scanned = NATIVE.scan(datas, ScanMode.PIXELS)
    info = scanned.info
    taken = info[:, KIND] == DecodeKind.PIXELS
    sizes = np.where(taken, info[:, HEIGHT] * info[:, WIDTH] * info[:, CHANNELS], 0)
    offsets = np.where(taken, np.cumsum(sizes) - sizes, -1)
    pixels = torch.zeros(max(int(sizes.sum()), 1), dtype=torch.uint8)
    declined = NATIVE.decode(scanned, pixels, offsets, torch.zeros(16, dtype=torch.uint8),
                             np.full(len(datas), -1, dtype=np.int64))
    out = []
    for position in range(len(datas)):
        if not taken[position] or declined[position]:
            out.append(None)
            continue
        height, width, channels = (int(value) for value in info[position, HEIGHT:CHANNELS + 1])
        start = int(offsets[position])
        out.append(pixels[start:start + height * width * channels].view(height, width, channels).numpy())
    return scanned, out


def _variants():
    """Real photo crops saved every way Pillow writes JPEGs, and damaged and foreign files."""
    rng = random.Random(0)
    photo = skimage_photo("astronaut.png").convert("RGB")
    cases = []
    for number in range(40):
        width, height = rng.choice([1, 2, 3, 9, 17, rng.randint(18, 512)]), rng.choice([1, 2, 7, rng.randint(8, 512)])
        crop = photo.crop((0, 0, width, height))
        if number % 5 == 0:
            crop = crop.convert("L")
        out = io.BytesIO()
        crop.save(out, "JPEG", quality=rng.choice([40, 75, 95]), subsampling=rng.choice([0, 1, 2]),
                  progressive=number % 3 == 0, optimize=number % 4 == 0,
                  restart_marker_blocks=2 if number % 7 == 0 else 0)
        cases.append(out.getvalue())
    whole = cases[-1]
    cases += [whole[: len(whole) // 2], whole[:600] + bytes(range(256)) * 4 + whole[600 + 1024:], b"", b"\xff\xd8\xff",
              b"not an image"]
    for form, mode in (("PNG", "RGB"), ("PNG", "RGBA"), ("WEBP", "RGB"), ("JPEG", "CMYK")):
        out = io.BytesIO()
        photo.resize((40, 30)).convert(mode).save(out, form)
        cases.append(out.getvalue())
    out = io.BytesIO()
    photo.resize((40, 30)).save(out, "JPEG", keep_rgb=True)  # Adobe-marked, RGB-coded
    cases.append(out.getvalue())
    return cases


def test_what_it_decodes_whole_is_pillows_pixels():
    datas = _variants()
    _, decoded = _decode_whole(datas)
    assert sum(pixels is not None for pixels in decoded) >= 40
    for position, (data, pixels) in enumerate(zip(datas, decoded)):
        mode, expected = _pillow(data)
        if pixels is None:  # left to Pillow: it decides (and the Python side reports its reason)
            continue
        assert mode in ("RGB", "L"), (position, mode)
        difference = np.abs(pixels.astype(int) - expected.astype(int)).max()
        assert np.array_equal(pixels, expected), f"input {position}: max diff {difference}"


def test_left_to_pillow_with_a_reason():
    """Foreign formats, damaged and empty data, missing files and folders: kind PYTHON with a note, no exception."""
    items = [b"", b"not an image", "/nonexistent/file.jpg", os.path.dirname(__file__), _variants()[-2]]
    scanned = NATIVE.scan(items, ScanMode.COEFFICIENTS)
    assert (scanned.info[:, KIND] == DecodeKind.PYTHON).all()
    assert all(scanned.notes), scanned.notes


def test_a_truncated_file_is_never_decoded_natively():
    """libjpeg pads a truncated file with grey and warns; Pillow raises: the native decoder declines it."""
    whole = _variants()[39]
    _, decoded = _decode_whole([whole[: len(whole) * 2 // 3]])
    assert decoded == [None]


def test_coefficient_scan_takes_photos_and_sizes_them():
    """The GPU route's scan: coefficient sizes from the header alone; RGB-coded and CMYK files are not taken."""
    datas = _variants()
    scanned = NATIVE.scan(datas, ScanMode.COEFFICIENTS)
    kinds = scanned.info[:, KIND]
    assert (kinds == DecodeKind.COEFFICIENTS).sum() >= 30
    assert (scanned.info[kinds == DecodeKind.COEFFICIENTS, COEFFICIENT_BYTES] > 0).all()
    assert kinds[-1] != DecodeKind.COEFFICIENTS and kinds[-2] == DecodeKind.PYTHON


def test_calls_from_several_threads_at_once():
    """Batches from several Python threads share the decoder's threads: each gets its own pixels."""
    datas = _variants()[:30]
    _, alone = _decode_whole(datas)
    results = [None] * 4

    def work(number):
        results[number] = _decode_whole(datas[number:] + datas[:number])[1]

    threads = [threading.Thread(target=work, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for number, got in enumerate(results):
        for want, have in zip(alone[number:] + alone[:number], got):
            assert (want is None and have is None) or np.array_equal(want, have)


def test_coefficient_route_bookkeeping_on_the_cpu(vit_b32_preprocess, photo_files, monkeypatch, tmp_path):
    """The exact path's GPU layout, its kernels stood in for on the CPU (the resize by the kernel's emulation,
    the JPEG kernels by Pillow's pixels written where the coefficients' table says): whole decodes, coefficient
    images, Pillow's images beside them in one layout, and images the decoder gives up on mid-batch (left to
    Pillow, their rows dropped from the layout) all come out as ``preprocess(Image.open(p))``."""
    import clip_flash
    import clip_flash.ops.image_resample as image_resample_module
    from clip_flash.inputs.image import jpeg_dct
    from photo_corpus import assert_same_as_reference
    from test_image_resample_packing import EmulatedExtension

    monkeypatch.setattr(image_resample_module, "load_extension", lambda: EmulatedExtension(4096))
    jpegs = [path for path in photo_files if path.suffix == ".jpg"][:20]
    whole = jpegs[0].read_bytes()
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole[: len(whole) * 2 // 3])  # the scan takes it; libjpeg warns while decoding
    items = jpegs[:8] + [truncated] + [path for path in photo_files if path.suffix == ".png"][:3] + jpegs[8:]
    scanned = NATIVE.scan([str(item) for item in items], ScanMode.COEFFICIENTS)
    by_table_row = [items[position] for position in range(len(items))
                    if scanned.info[position, KIND] == DecodeKind.COEFFICIENTS]
    assert len(by_table_row) >= 12

    def fill(batch, pixels):  # Pillow's pixels where the kernels would write theirs
        for row, item in enumerate(by_table_row):
            _, expected = _pillow(item.read_bytes())
            start = int(batch.table[row, 1])
            if expected is not None:
                pixels[start:start + expected.size].copy_(torch.from_numpy(expected.reshape(-1).copy()))

    monkeypatch.setattr(jpeg_dct.DctBatch, "decode", fill)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
        prep.resize.implementation = "kernel"  # as on a GPU with the extension built
        prep.scan_mode = ScanMode.COEFFICIENTS
        decoded = prep.decode(items)
        assert decoded.packed is not None and decoded.packed.dct is not None and decoded.packed.keep is not None
        prepared = prep.prepare(decoded)
    assert prepared.routes["jpeg-dct"] >= 12, prepared.routes
    assert_same_as_reference(prepared, vit_b32_preprocess, items)
