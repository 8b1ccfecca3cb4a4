"""The kernel's route through reused pixel arenas, checked on the CPU with the numpy emulation of the kernel:
workers (threads or processes) write each task's pixels into its own region of one arena, the upload copies
those runs into the plan's layout, images that do not fit their region go in a second launch, and an arena
is reused for the next batch only when nothing views it any more."""
from __future__ import annotations

import gc
import io

import pytest
import torch
from PIL import Image

import clip_flash
import clip_flash.inputs.pixel_arena as pixel_arena
import clip_flash.ops.image_resample as image_resample_module
from photo_corpus import assert_same_as_reference, skimage_photo

pytestmark = pytest.mark.skipif(not pixel_arena.arenas_supported(), reason="pixel arenas need Linux memfd")


@pytest.fixture
def emulated_kernel(monkeypatch):
    from test_image_resample_packing import EmulatedExtension

    monkeypatch.setattr(image_resample_module, "load_extension", lambda: EmulatedExtension(4096))


@pytest.fixture(scope="module")
def kernel_route_prep(vit_b32_preprocess):
    """A preprocessor per executor, shared by the tests (starting processes is slow), with fresh arenas
    for each test and the kernel route chosen (as on a GPU with the extension built)."""
    made = {}

    def get(executor: str) -> clip_flash.ImagePreprocessor:
        if executor not in made:
            made[executor] = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32,
                                                          workers=2, executor=executor)
            made[executor].start(wait=True)  # the processes' route, not the threads that stand in until then
        prep = made[executor]
        prep.resize.implementation = "kernel"
        if prep._arenas is not None:
            prep._arenas.close()
            prep._arenas = None
        return prep

    yield get
    for prep in made.values():
        prep.close()


def _jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _inputs():
    photo = skimage_photo("coffee.png").convert("RGB")
    sizes = [(90, 60), (61, 45), (120, 80), (33, 70), (90, 60), (75, 75)]
    items = [_jpeg(photo.resize(size)) for size in sizes]
    items.insert(2, b"not an image")
    items.append(photo.resize((50, 40)).convert("L"))  # in memory: decoded in a thread
    return items


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_arena_route_is_exact(vit_b32_preprocess, emulated_kernel, kernel_route_prep, executor):
    items = _inputs()
    prep = kernel_route_prep(executor)
    decoded = prep.decode(items)
    packed = decoded.packed
    assert packed is not None and packed.segments is not None and packed.lease is not None
    assert sorted(packed.indices) == [0, 1, 3, 4, 5, 6, 7]
    assert sum(size for _, size, _ in packed.segments) == sum(h * w * c for h, w, c in packed.plan.shapes)
    prepared = prep.prepare(decoded)
    assert prepared.failures[0][0] == 2
    assert_same_as_reference(prepared, vit_b32_preprocess, items)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_images_that_do_not_fit_their_region_take_a_second_launch(vit_b32_preprocess, emulated_kernel,
                                                                   kernel_route_prep, monkeypatch, executor):
    monkeypatch.setattr(pixel_arena, "INITIAL_BYTES_PER_IMAGE", 10000)  # some chunks overflow
    items = _inputs()
    prep = kernel_route_prep(executor)
    decoded = prep.decode(items)
    assert len(decoded.packed.indices) < 7  # the rest are pixel items outside the arena
    prepared = prep.prepare(decoded)
    assert prep._arenas.bytes_per_image > 10000  # later batches get more room
    assert_same_as_reference(prepared, vit_b32_preprocess, items)


def test_an_arena_is_reused_only_when_released(vit_b32_preprocess, emulated_kernel):
    items = _inputs()
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
        prep.resize.implementation = "kernel"
        first = prep.decode(items)
        second = prep.decode(items)
        assert first.packed.lease.arena is not second.packed.lease.arena  # both alive: two arenas
        kept = first.items[0].pixels.clone()
        arena = first.packed.lease.arena
        view = first.items[0].pixels
        del first
        gc.collect()
        third = prep.decode(items[::-1])
        assert third.packed.lease.arena is not arena  # a pixel view of the first batch still holds it
        assert torch.equal(view, kept)
        del view
        gc.collect()
        fourth = prep.decode(items)
        assert fourth.packed.lease.arena is arena  # released with its last view, then reused
        assert_same_as_reference(prep.prepare(fourth), vit_b32_preprocess, items)
        assert_same_as_reference(prep.prepare(third), vit_b32_preprocess, items[::-1])
        del second
