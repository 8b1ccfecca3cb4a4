"""The fast path's header scan agrees with Pillow's Image.open on every JPEG it accepts, and declines the rest."""
from __future__ import annotations

import io
import random
import struct

import pytest
from PIL import Image, JpegImagePlugin

from clip_flash.inputs.image.image_decoding import DecodeOptions, decode_item
from clip_flash.inputs.image.jpeg_header import JpegHeader, scan_jpeg_header


def _pillow_fields(data: bytes):
    """(format, mode, (height, width), get_sampling, progressive) as Pillow's Image.open reports them, or None
    if it refuses."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return (image.format, image.mode, (image.height, image.width), JpegImagePlugin.get_sampling(image),
                    bool(image.info.get("progressive")))
    except Exception:  # noqa: BLE001 - Pillow refusing is an answer too
        return None


def _agrees_with_pillow(data: bytes, header: JpegHeader) -> bool:
    fields = _pillow_fields(data)
    return fields is not None and fields == ("JPEG", "L" if header.channels == 1 else "RGB",
                                             (header.height, header.width), header.sampling, header.progressive)


def test_scan_agrees_with_pillow_on_the_photo_corpus(photo_files):
    accepted = 0
    for path in photo_files:
        data = path.read_bytes()
        header = scan_jpeg_header(data)
        fields = _pillow_fields(data)
        if header is not None:
            accepted += 1
            assert _agrees_with_pillow(data, header), (path.name, header, fields)
        elif fields is not None and fields[0] == "JPEG" and fields[1] in ("RGB", "L"):
            # Declined, yet Pillow opens it as a plain JPEG: only files stored as RGB (an Adobe marker) may be.
            assert "_6." in path.name, (path.name, fields)
    jpegs = [path for path in photo_files if path.suffix == ".jpg" and "cmyk" not in path.name]
    assert accepted >= len(jpegs) - sum("_6." in path.name for path in jpegs) > 0


def _jpeg(mode="RGB", size=(64, 48), **options) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, "red" if mode != "L" else 128).save(buffer, "JPEG", **options)
    return buffer.getvalue()


@pytest.mark.parametrize("options,expected", [
    ({"subsampling": 0}, JpegHeader(48, 64, 3, 0)),
    ({"subsampling": 1}, JpegHeader(48, 64, 3, 1)),
    ({"subsampling": 2}, JpegHeader(48, 64, 3, 2)),
    ({"progressive": True, "subsampling": 2}, JpegHeader(48, 64, 3, 2, True)),
])
def test_scan_reads_size_and_sampling(options, expected):
    assert scan_jpeg_header(_jpeg(**options)) == expected


def test_scan_declines_what_it_cannot_vouch_for():
    plain = _jpeg()
    sof = plain.index(b"\xff\xc0")
    assert scan_jpeg_header(_jpeg("L")) == JpegHeader(48, 64, 1, -1)
    assert scan_jpeg_header(_jpeg("CMYK")) is None                      # 4 components (Pillow: CMYK)
    assert scan_jpeg_header(_jpeg(keep_rgb=True)) is None               # Adobe-marked RGB storage
    assert scan_jpeg_header(plain[:sof]) is None                        # no frame header
    assert scan_jpeg_header(plain[:sof + 6]) is None                    # frame header cut short
    assert scan_jpeg_header(b"") is None and scan_jpeg_header(b"hello, world") is None
    twelve_bit = plain[:sof + 4] + bytes([12]) + plain[sof + 5:]
    assert scan_jpeg_header(twelve_bit) is None
    zero_height = plain[:sof + 5] + b"\x00\x00" + plain[sof + 7:]
    assert scan_jpeg_header(zero_height) is None
    lossless = plain[:sof + 1] + b"\xc3" + plain[sof + 2:]
    assert scan_jpeg_header(lossless) is None
    multi_picture = plain[:2] + b"\xff\xe2" + struct.pack(">H", 10) + b"MPF\0abcd" + plain[2:]
    assert scan_jpeg_header(multi_picture) is None
    garbage_between = plain[:2] + b"\x00" + plain[2:]
    assert scan_jpeg_header(garbage_between) is None


def test_scan_never_disagrees_with_pillow_on_mutated_headers():
    """Random byte changes in the headers of real-looking JPEGs: whatever the scan accepts, Pillow opens
    with the same fields, or refuses (then nvJPEG decides, and the exact CPU decode after it)."""
    rng = random.Random(0)
    seeds = [_jpeg(size=(97, 61), subsampling=s) for s in (0, 1, 2)] + [_jpeg("L", size=(33, 70)),
                                                                         _jpeg(progressive=True)]
    accepted = refused_by_pillow = 0
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        header_end = data.index(b"\xff\xda")
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(2, header_end + 2)] = rng.randrange(256)
        data = bytes(data)
        header = scan_jpeg_header(data)
        if header is None:
            continue
        accepted += 1
        fields = _pillow_fields(data)
        if fields is None:
            refused_by_pillow += 1
            continue
        assert _agrees_with_pillow(data, header), (header, fields)
    assert accepted > 1000


def test_fast_path_cpu_step_routes_like_pillow(photo_files, vit_b32_preprocess):
    """decode='gpu''s CPU step: the scan's route carries the same size, channels and sampling as Pillow's."""
    options = DecodeOptions(vit_b32_preprocess, keep_jpeg_bytes=True)
    routed = 0
    for index, path in enumerate(photo_files):
        item = decode_item(index, path, options)
        if item.route != "gpu-jpeg":
            continue
        routed += 1
        fields = _pillow_fields(path.read_bytes())
        assert fields[2] == item.image_size and fields[3] == item.jpeg_sampling and fields[4] == item.jpeg_progressive
        assert {"L": 1, "RGB": 3}[fields[1]] == item.channels
    assert routed > 0
