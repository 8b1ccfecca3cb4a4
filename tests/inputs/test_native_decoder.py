"""The native batch decoder (``csrc/image_batch_decoder.cpp``): what it decodes whole is Pillow's pixels bit for
bit; what it is not sure of is left to Pillow, never decoded differently and never raised; its threads serve
calls from several Python threads. Without the extension: its sources built for the CPU (skipped where they cannot
be; the package's Python threads then decode)."""
from __future__ import annotations

import io
import os
import random
import struct
import threading
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from clip_flash.inputs.image.native_decode import (CHANNELS, COEFFICIENT_BYTES, FORMAT, HEIGHT, KIND, WIDTH,
                                                   DecodeKind, FileFormat, ScanMode)
from photo_corpus import skimage_photo
from tests.utils import native_batch_decoder

NATIVE, WHY_NOT = native_batch_decoder(threads=3)
pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"no native batch decoder here: {WHY_NOT}")


@pytest.fixture
def preparers_decode_natively(monkeypatch):
    """Preparers made in the test take this module's decoder's kind (the CPU build where the extension is not)."""
    from clip_flash.inputs.image.native_decode import NativeBatchDecoder

    monkeypatch.setattr(NativeBatchDecoder, "create",
                        staticmethod(lambda threads: NativeBatchDecoder(NATIVE._extension, threads)))


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
    return scanned, _decode_scanned(scanned)


def _decode_scanned(scanned):
    """The pixels of every item a ``ScanMode.PIXELS`` scan took and the decode wrote (None for the others)."""
    info = scanned.info
    count = len(info)
    taken = info[:, KIND] == DecodeKind.PIXELS
    sizes = np.where(taken, info[:, HEIGHT] * info[:, WIDTH] * info[:, CHANNELS], 0)
    offsets = np.where(taken, np.cumsum(sizes) - sizes, -1)
    pixels = torch.zeros(max(int(sizes.sum()), 1), dtype=torch.uint8)
    declined = NATIVE.decode(scanned, pixels, offsets, torch.zeros(16, dtype=torch.uint8),
                             np.full(count, -1, dtype=np.int64))
    out = []
    for position in range(count):
        if not taken[position] or declined[position]:
            out.append(None)
            continue
        height, width, channels = (int(value) for value in info[position, HEIGHT:CHANNELS + 1])
        start = int(offsets[position])
        out.append(pixels[start:start + height * width * channels].view(height, width, channels).numpy())
    return out


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


def test_a_scan_of_bytes_outlives_the_callers_objects(tmp_path):
    """The scan views the bytes it is given (no copy): a batch keeps them alive, so decoding after the caller
    dropped its list and every bytes object (and the garbage was collected) gives what it gives with them kept; the
    tensors viewing a batch's encoded bytes (given, or read from a file) keep it alive in turn."""
    import gc

    kept = [data for data in _variants() if data]
    _, expected = _decode_whole(kept)
    datas = [bytes(bytearray(data)) for data in kept]  # objects of their own, freed when dropped
    scanned = NATIVE.scan(datas, ScanMode.PIXELS)
    (tmp_path / "file.jpg").write_bytes(kept[0])
    encoded = NATIVE.scan([bytes(bytearray(data)) for data in kept] + [str(tmp_path / "file.jpg")], ScanMode.ENCODED)
    del datas
    gc.collect()
    junk = [bytes(len(data)) for data in kept]  # memory the freed objects would have been handed to
    decoded = _decode_scanned(scanned)
    assert sum(want is not None for want in expected) >= 40
    for position, (want, got) in enumerate(zip(expected, decoded)):
        assert (want is None) == (got is None), position
        assert want is None or np.array_equal(got, want), position
    views = NATIVE.views(encoded, range(len(kept) + 1))
    del encoded  # the views keep the batch, and the bytes it views, alive
    gc.collect()
    junk += [bytes(len(data)) for data in kept]
    assert [view.numpy().tobytes() for view in views] == kept + [kept[0]]
    del junk


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


def test_a_host_gate_handed_to_the_decode_is_opened_once_the_buffers_are_written():
    """``opens``: the decoder raises the gate's counter to the ticket when it returns (never lowers it), so a thread
    launching behind the gate need not give the GIL back for it to open."""
    datas = _variants()[:3]
    scanned = NATIVE.scan(datas, ScanMode.PIXELS)
    info = scanned.info
    sizes = info[:, HEIGHT] * info[:, WIDTH] * info[:, CHANNELS]
    offsets = np.cumsum(sizes) - sizes
    pixels = torch.zeros(int(sizes.sum()), dtype=torch.uint8)
    counter = torch.tensor([3, 0], dtype=torch.int64)
    NATIVE.decode(scanned, pixels, offsets, torch.zeros(16, dtype=torch.uint8), np.full(3, -1, dtype=np.int64),
                  opens=(counter, 5))
    assert counter.tolist() == [5, 0] and pixels.any()
    NATIVE.decode(scanned, pixels, offsets, torch.zeros(16, dtype=torch.uint8), np.full(3, -1, dtype=np.int64),
                  opens=(counter, 4))
    assert counter.tolist() == [5, 0]
    # A buffer too small for the pixels: the images are declined, and the gate opened all the same.
    declined = NATIVE.decode(scanned, pixels[:10], offsets, torch.zeros(16, dtype=torch.uint8),
                             np.full(3, -1, dtype=np.int64), opens=(counter, 9))
    assert all(declined) and counter.tolist() == [9, 0]


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


def test_coefficient_route_bookkeeping_on_the_cpu(vit_b32_preprocess, photo_files, monkeypatch, tmp_path,
                                                  preparers_decode_natively):
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
    # resample_packed uploads the batch and calls the launch it returns with the layout's pixel area
    monkeypatch.setattr(jpeg_dct.DctBatch, "upload", lambda batch, device: lambda pixels: fill(batch, pixels))
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
        prep.resize.implementation = "kernel"  # as on a GPU with the extension built
        prep.scan_mode = ScanMode.COEFFICIENTS
        decoded = prep.decode(items)
        assert decoded.packed is not None and decoded.packed.dct is not None and decoded.packed.keep is not None
        prepared = prep.prepare(decoded)
    assert prepared.routes["jpeg-dct"] >= 12, prepared.routes
    assert_same_as_reference(prepared, vit_b32_preprocess, items)


def test_the_layout_handed_out_before_the_decode_is_the_batch_unless_a_file_leaves_it(vit_b32_preprocess, photo_files,
                                                                                    tmp_path,
                                                                                    preparers_decode_natively):
    """``on_layout`` (the server's early launch), the GPU layout's bookkeeping on the CPU: the layout handed out
    before the decode is the decoded batch's own (same object, same JPEG table as a decode without the hook) when
    every file decodes natively; not when one is declined mid-decode (a truncated JPEG) or is Pillow's (RGBA); no
    layout at all when a file is Pillow's from the scan on."""
    import clip_flash
    from clip_flash.inputs.image.native_batch import NativeBatch

    jpegs = [str(path) for path in photo_files if path.suffix == ".jpg"]
    kinds = NATIVE.scan(jpegs, ScanMode.COEFFICIENTS).info[:, KIND]
    jpegs = [path for path, kind in zip(jpegs, kinds) if kind == DecodeKind.COEFFICIENTS][:6]
    pngs = [str(path) for path in photo_files if path.name == "png_rgb.png"]
    rgba = [str(path) for path in photo_files if path.name == "png_rgba.png"]
    whole = open(jpegs[0], "rb").read()
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole[: len(whole) * 2 // 3])
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
        prep.resize.implementation = "kernel"  # as on a GPU with the extension built

        def decode(items, on_layout=None):
            return NativeBatch(prep._native_decoder(), ScanMode.COEFFICIENTS, prep.resize, prep.options,
                               prep._python_threads(), on_layout=on_layout).decode(items)

        for items, is_batch in (([jpegs[0]], True), (jpegs + pngs, True), (jpegs[:2] + [str(truncated)], False),
                                (jpegs[:2] + rgba, None)):
            handed = []
            decoded = decode(items, on_layout=lambda layout: handed.append(layout))
            plain = decode(items)
            assert len(handed) == (0 if is_batch is None else 1), items
            assert decoded.early_layout_is_batch is bool(is_batch)
            if is_batch:
                assert decoded.packed is handed[0] and handed[0].indices == plain.packed.indices
                assert np.array_equal(handed[0].dct.table, plain.packed.dct.table)
            assert decoded.indices == plain.indices and decoded.failures == plain.failures


# -- PNG --------------------------------------------------------------------------------------------------------
def _chunk(kind: bytes, data: bytes, crc_delta: int = 0) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", (zlib.crc32(kind + data) + crc_delta) & 0xFFFFFFFF))


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def _png(pixels: np.ndarray, rng: random.Random, before=(), after=(), idat_parts: int = 1, interlace: int = 0,
         filter_override=None, stream_extra: bytes = b"") -> bytes:
    """A PNG of ``pixels`` (uint8 (H, W) or (H, W, 3)) written here, not by Pillow: each row with a random one of
    the five filters (or ``filter_override``), the stream cut into ``idat_parts`` IDAT chunks, and the given
    chunks before the image data and after it."""
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    height, width = pixels.shape[:2]
    flat = pixels.reshape(height, width * channels).astype(np.int64)
    raw = bytearray()
    previous = np.zeros(width * channels, dtype=np.int64)
    for y in range(height):
        row = flat[y]
        left = np.concatenate([np.zeros(channels, dtype=np.int64), row[:-channels]])
        corner = np.concatenate([np.zeros(channels, dtype=np.int64), previous[:-channels]])
        kind = filter_override if filter_override is not None else rng.randrange(5)
        predicted = [0, left, previous, (left + previous) // 2, _paeth(left, previous, corner)][min(kind, 4)]
        raw.append(kind)
        raw += ((row - predicted) % 256).astype(np.uint8).tobytes()
        previous = row
    stream = zlib.compress(bytes(raw), rng.choice([0, 1, 6, 9])) + stream_extra
    cuts = sorted(rng.randrange(len(stream) + 1) for _ in range(idat_parts - 1))
    parts = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    header = struct.pack(">IIBBBBB", width, height, 8, 0 if channels == 1 else 2, 0, 0, interlace)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + b"".join(before)
            + b"".join(_chunk(b"IDAT", part) for part in parts) + b"".join(after) + _chunk(b"IEND", b""))


def _icc_chunk(compression: int = 0) -> bytes:
    return _chunk(b"iCCP", b"a profile\x00" + bytes([compression]) + zlib.compress(bytes(range(256)) * 8))


def _photo_pixels(rng: random.Random, height: int, width: int, grayscale: bool) -> np.ndarray:
    photo = skimage_photo("astronaut.png").convert("L" if grayscale else "RGB")
    left, top = rng.randrange(512 - width + 1), rng.randrange(512 - height + 1)
    return np.asarray(photo.crop((left, top, left + width, top + height)))


def test_plain_pngs_decode_natively_to_pillows_pixels():
    """8-bit L and RGB PNGs of every size shape, rows under all five filters, the stream split over IDAT chunks
    (empty ones too), with the chunks photos carry (ICC profile, text, gamma, physical size, sRGB, chromaticity,
    a suggested palette, a private chunk): decoded natively, Pillow's pixels bit for bit."""
    rng = random.Random(1)
    extras = [_icc_chunk(), _chunk(b"tEXt", b"Software\x00clip_flash test"), _chunk(b"gAMA", struct.pack(">I", 45455)),
              _chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1)), _chunk(b"sRGB", b"\x00"),
              _chunk(b"cHRM", bytes(32)), _chunk(b"prVt", b"private")]
    datas = []
    for number, (height, width) in enumerate([(1, 1), (1, 9), (7, 1), (3, 5), (17, 33), (64, 47), (200, 311)]):
        for grayscale in (False, True):
            before = rng.sample(extras, rng.randrange(4))
            if not grayscale and number % 2:
                before.append(_chunk(b"PLTE", bytes(range(48))))
            datas.append(_png(_photo_pixels(rng, height, width, grayscale), rng, before=before,
                              idat_parts=rng.choice([1, 2, 5])))
    out = io.BytesIO()
    skimage_photo("astronaut.png").convert("RGB").save(out, "PNG", optimize=True)  # as Pillow writes them
    datas.append(out.getvalue())
    scanned, decoded = _decode_whole(datas)
    for position, (data, pixels) in enumerate(zip(datas, decoded)):
        mode, expected = _pillow(data)
        assert pixels is not None, (position, scanned.notes[position])
        assert np.array_equal(pixels, expected), f"PNG {position}: differs from Pillow's {mode} pixels"
    assert (scanned.info[:, FORMAT] == FileFormat.PNG).all()


def test_pngs_pillow_reads_its_own_way_are_left_to_it():
    """Alpha, palette, 16-bit, transparency, interlacing, animation, compressed text, a chunk after the image
    data, a bad CRC where Pillow checks one, a truncated file, an unknown filter, data past the image's end,
    a header short of the rows: never decoded natively
    (scan or decode declines, with a reason), so Pillow's pixels or its error stand."""
    rng = random.Random(2)
    pixels = _photo_pixels(rng, 24, 31, grayscale=False)
    saved = []
    photo = Image.fromarray(pixels)
    for image, options in ((photo.convert("RGBA"), {}), (photo.convert("LA"), {}), (photo.convert("P"), {}),
                           (photo.convert("I;16"), {}), (photo.convert("1"), {}),
                           (photo, {"save_all": True, "append_images": [photo.rotate(90)]})):
        out = io.BytesIO()
        image.save(out, "PNG", **options)
        saved.append(out.getvalue())
    whole = _png(pixels, rng)
    crafted = [
        _png(pixels, rng, before=[_chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03")]),
        _png(pixels, rng, interlace=1),
        _png(pixels, rng, before=[_chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"text"))]),
        _png(pixels, rng, after=[_chunk(b"tEXt", b"Comment\x00after the image")]),
        _png(pixels, rng, before=[_icc_chunk(compression=1)]),
        _png(pixels, rng, before=[_chunk(b"gAMA", struct.pack(">I", 45455), crc_delta=1)]),  # Pillow refuses it
        whole[: len(whole) // 2],
        _png(pixels, rng, filter_override=5),
        _png(pixels, rng, stream_extra=b"\x00" * 7),
        _png(pixels[:23], rng)[:33] + _png(pixels, rng)[33:],  # the header says 23 rows, the data holds 24
    ]
    datas = saved + crafted
    scanned, decoded = _decode_whole(datas)
    for position, pixels_out in enumerate(decoded):
        assert pixels_out is None, (position, scanned.notes[position])
    notes = scanned.notes
    assert all(note for note, kind in zip(notes, scanned.info[:, KIND]) if kind == DecodeKind.PYTHON)


def test_pngs_through_the_preparer_equal_the_reference(vit_b32_preprocess, tmp_path, preparers_decode_natively):
    """Natively decoded PNGs and the ones left to Pillow, mixed with JPEGs in one batch from files: every row is
    ``preprocess(Image.open(path))``, every failure Pillow's."""
    import clip_flash
    from photo_corpus import assert_same_as_reference

    rng = random.Random(3)
    files = []
    for number in range(12):
        grayscale = number % 3 == 0
        data = _png(_photo_pixels(rng, rng.randint(40, 300), rng.randint(40, 300), grayscale), rng,
                    before=[_icc_chunk()] if number % 4 == 0 else [],
                    after=[_chunk(b"tEXt", b"k\x00v")] if number % 5 == 0 else [])
        files.append(tmp_path / f"{number}.png")
        files[-1].write_bytes(data if number != 7 else data[: len(data) // 2])
    jpeg = io.BytesIO()
    skimage_photo("astronaut.png").convert("RGB").save(jpeg, "JPEG", quality=90)
    files.insert(5, tmp_path / "photo.jpg")
    files[5].write_bytes(jpeg.getvalue())
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
        prepared = prep([str(path) for path in files])
    assert prepared.routes.get("png", 0) >= 8, prepared.routes
    assert_same_as_reference(prepared, vit_b32_preprocess, files)


def test_positions_scanned_for_the_exact_route_beside_encoded_ones():
    """decode="gpu"'s exact share: the positions passed as ``exact`` are scanned for coefficients, the other JPEGs
    stay encoded for nvJPEG; positions out of range are ignored."""
    datas = [data for data in _variants() if NATIVE.scan([data], ScanMode.COEFFICIENTS).info[0, KIND]
             == DecodeKind.COEFFICIENTS][:8]
    assert len(datas) == 8
    scanned = NATIVE.scan(datas, ScanMode.ENCODED, exact=[1, 4, 99, -1])
    kinds = scanned.info[:, KIND].tolist()
    assert kinds == [DecodeKind.ENCODED, DecodeKind.COEFFICIENTS, DecodeKind.ENCODED, DecodeKind.ENCODED,
                     DecodeKind.COEFFICIENTS, DecodeKind.ENCODED, DecodeKind.ENCODED, DecodeKind.ENCODED]
    assert (scanned.info[[1, 4], COEFFICIENT_BYTES] > 0).all()
    assert kinds == NATIVE.scan(datas, ScanMode.ENCODED, exact=[1, 4]).info[:, KIND].tolist()
