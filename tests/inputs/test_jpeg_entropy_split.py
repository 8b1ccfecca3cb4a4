"""One JPEG's entropy decode split across the native threads (``csrc/jpeg_entropy_split.cpp``): the coefficients are
libjpeg-turbo's, byte for byte, or the split is declined and libjpeg decodes; a damaged file never gets coefficients
libjpeg would not give. Without the extension: the decoder's sources built for the CPU (skipped where they cannot
be)."""
from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from clip_flash.inputs.image.native_decode import COEFFICIENT_BYTES, KIND, DecodeKind, ScanMode, split_at_most
from photo_corpus import skimage_photo
from tests.utils import native_batch_decoder

THREADS = 16
NATIVE, WHY_NOT = native_batch_decoder(threads=THREADS)
pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"no native batch decoder here: {WHY_NOT}")


def _coefficients(datas, split: bool):
    """Per input: (why not, the coefficient bytes) through the coefficient route, split or one thread each."""
    scanned = NATIVE.scan(datas, ScanMode.COEFFICIENTS)
    info = scanned.info
    taken = info[:, KIND] == DecodeKind.COEFFICIENTS
    sizes = np.where(taken, -(-info[:, COEFFICIENT_BYTES] // 16) * 16, 0)
    offsets = np.where(taken, np.cumsum(sizes) - sizes, -1)
    out = torch.full((max(int(sizes.sum()), 16),), 0xA5, dtype=torch.uint8)
    declined = NATIVE.decode(scanned, torch.zeros(16, dtype=torch.uint8), np.full(len(datas), -1, dtype=np.int64),
                             out, offsets, split_jpegs=split)
    results = []
    for position in range(len(datas)):
        if not taken[position]:
            results.append(("not scanned for coefficients", None))
            continue
        start = int(offsets[position])
        results.append((declined[position], out[start:start + int(info[position, COEFFICIENT_BYTES])].numpy().copy()))
    return results


def _one_by_one(datas):
    """Each input alone (a batch of one, so that it splits), split and not: [(split result, libjpeg result)]."""
    return [(_coefficients([data], True)[0], _coefficients([data], False)[0]) for data in datas]


def _jpegs():
    """Real photos at sizes where a split has pieces, saved the ways Pillow writes baseline JPEGs."""
    rng = random.Random(0)
    photos = [skimage_photo(name).convert("RGB") for name in ("astronaut.png", "chelsea.png", "coffee.png")]
    cases = []
    for number in range(24):
        photo = photos[number % len(photos)]
        width, height = rng.randint(300, photo.width), rng.randint(200, photo.height)
        crop = photo.crop((0, 0, width, height))
        if number % 6 == 0:
            crop = crop.convert("L")
        out = io.BytesIO()
        crop.save(out, "JPEG", quality=rng.choice([75, 90, 95, 100]), subsampling=rng.choice([0, 1, 2]),
                  optimize=number % 4 == 0)
        cases.append(out.getvalue())
    return cases


def test_split_coefficients_are_libjpegs():
    before = NATIVE.split_totals()
    cases = _jpegs()
    for (split_why, split_bytes), (whole_why, whole_bytes) in _one_by_one(cases):
        assert split_why == whole_why == ""
        assert np.array_equal(split_bytes, whole_bytes)
    after = NATIVE.split_totals()
    # Every one of these is large enough to split: none may have gone to libjpeg instead.
    assert after["split"] - before["split"] == len(cases), after["last_declined"]
    assert after["declined"] == before["declined"]
    assert after["pieces"] - before["pieces"] >= 2 * len(cases)  # every one cut at least once


def test_what_it_does_not_handle_goes_to_libjpeg():
    photo = skimage_photo("astronaut.png").convert("RGB")
    kinds = {"progressive": {"progressive": True}, "restart markers": {"restart_marker_blocks": 4}}
    for reason, options in kinds.items():
        out = io.BytesIO()
        photo.save(out, "JPEG", quality=90, **options)
        before = NATIVE.split_totals()
        (split_why, split_bytes), (whole_why, whole_bytes) = _one_by_one([out.getvalue()])[0]
        assert split_why == whole_why == "" and np.array_equal(split_bytes, whole_bytes)
        after = NATIVE.split_totals()
        assert after["declined"] == before["declined"] + 1 and reason in after["last_declined"]


def test_damaged_files_get_libjpegs_answer():
    """Bytes changed, files cut short, bytes before EOI and after it: the split gives libjpeg's coefficients or
    declines; it never writes coefficients where libjpeg reports a failure or a warning."""
    rng = random.Random(1)
    cases = []
    for data in _jpegs()[:12]:
        middle = len(data) // 2
        changed = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            changed[rng.randrange(middle, len(data) - 2)] = rng.randrange(256)
        cases += [bytes(changed), data[:rng.randrange(middle, len(data) - 2)],
                  data[:-2] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 9))) + data[-2:],
                  data + b"trailing bytes after EOI"]
    before = NATIVE.split_totals()
    outcomes = {"split": 0, "failed both ways": 0}
    for (split_why, split_bytes), (whole_why, whole_bytes) in _one_by_one(cases):
        assert split_why == whole_why
        if whole_why:
            outcomes["failed both ways"] += 1
        else:
            assert np.array_equal(split_bytes, whole_bytes)
    after = NATIVE.split_totals()
    outcomes["split"] = after["split"] - before["split"]
    # Both kinds of outcome occur here (trailing bytes after EOI split; cut files fail), so this cannot pass idly.
    assert outcomes["split"] >= 12 and outcomes["failed both ways"] >= 6, outcomes


def test_only_batches_of_few_jpegs_split():
    assert [split_at_most(threads) for threads in (1, 3, 4, 8, 15, 16, 32)] == [0, 0, 1, 1, 1, 2, 4]
    cases = _jpegs()[: split_at_most(THREADS) + 1]
    before = NATIVE.split_totals()
    results = _coefficients(cases, split=True)  # one more JPEG than the threads split: one thread each
    assert all(why == "" for why, _ in results)
    assert NATIVE.split_totals()["split"] == before["split"]
    results = _coefficients(cases[:-1], split=True)
    assert NATIVE.split_totals()["split"] == before["split"] + len(cases) - 1
    reference = _coefficients(cases[:-1], split=False)
    for (_, split_bytes), (_, whole_bytes) in zip(results, reference):
        assert np.array_equal(split_bytes, whole_bytes)
    few_threads = native_batch_decoder(threads=4)[0]
    before = few_threads.split_totals()
    scanned = few_threads.scan(cases[:2], ScanMode.COEFFICIENTS)
    sizes = -(-scanned.info[:, COEFFICIENT_BYTES] // 16) * 16
    out = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    offsets = np.cumsum(sizes) - sizes
    for count in (2, 1):  # two JPEGs on four threads: one thread each; one: split
        at = np.where(np.arange(2) < count, offsets, -1).astype(np.int64)
        assert few_threads.decode(scanned, out[:16], np.full(2, -1, dtype=np.int64), out, at) == ["", ""]
    assert few_threads.split_totals()["split"] == before["split"] + 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the coefficient route runs with the GPU's resize")
def test_one_image_through_the_preparer_is_the_reference(vit_b32_preprocess):
    """The exact path's contract with the split in it: one JPEG's row is ``preprocess(Image.open(p))`` bit for bit."""
    import clip_flash

    prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, workers=THREADS)
    native = prep._native_decoder()
    for data in _jpegs()[:6]:
        before = native.split_totals()["split"]
        row = prep([data]).pixels[0].cpu()
        assert native.split_totals()["split"] == before + 1
        assert torch.equal(row, vit_b32_preprocess(Image.open(io.BytesIO(data))))
