"""The CUDA image-resample kernel is bit-identical to OpenCLIP's ``preprocess(pil_image)`` and to the CPU
implementation: every resize mode x interpolation x size, random images and real photos, RGB and L,
float32 and the float16/bfloat16 casts, mixed batches, huge images with bounded memory."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from clip_flash.ops._extension import load_extension
from clip_flash.inputs.image.pillow_resample import preprocess_batch_cpu
from clip_flash.inputs.image.transform_spec import spec_from_preprocess
from clip_flash.ops.image_resample import plan_batch, resample_batch, resample_packed


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(load_extension() is None, reason="needs the compiled extension clip_flash._C"),
]


def _accepted(corpora, preprocess, corpus):
    """(names, uint8 tensors, stacked float32 references) of the images the reference accepts."""
    names, images, references = [], [], []
    for name, array in corpus:
        expected = corpora.reference(preprocess, array)
        if isinstance(expected, Exception):
            continue
        names.append(name)
        images.append(torch.tensor(array))
        references.append(expected)
    return names, images, torch.stack(references)


def assert_kernel_exact(corpora, preprocess, corpus, dtypes=(torch.float32,), against_cpu=False):
    """The kernel's output equals ``preprocess(pil)`` (fp32) and its cast (fp16/bf16) for every image
    the reference accepts; with ``against_cpu`` also the CPU implementation's float32 output."""
    spec = spec_from_preprocess(preprocess)
    names, images, reference = _accepted(corpora, preprocess, corpus)
    for dtype in dtypes:
        got = resample_batch(images, spec, device="cuda", dtype=dtype)
        assert got.dtype == dtype and got.device.type == "cuda"
        got, expected = got.cpu(), reference.to(dtype)
        bad = [f"{n} {tuple(i.shape)}: {(r != g).sum().item()} values differ"
               for n, i, r, g in zip(names, images, expected, got) if not torch.equal(r, g)]
        assert not bad, (f"{dtype}: {len(bad)} of {len(names)} images differ from preprocess(pil):\n"
                         + "\n".join(bad[:20]))
        if against_cpu and dtype == torch.float32:  # the casts follow elementwise from float32
            assert torch.equal(got, preprocess_batch_cpu(images, spec, dtype))
    return len(names)


def kernel_in_order(images, spec, vertical_first, dtype=torch.float32):
    """The kernel's output with every image's pass order forced (the meta column overwritten)."""
    from clip_flash.ops.image_resample import META_FIELDS

    plan = plan_batch([tuple(image.shape) for image in images], spec)
    meta = plan.meta.copy()  # plans are read-only (shared through plan_batch's cache): a forced-order copy
    meta[:, META_FIELDS.index("vertical_first")] = int(vertical_first)
    plan = dataclasses.replace(plan, meta=meta)
    buffer = plan.allocate_host()
    for index, image in enumerate(images):
        plan.pixel_slot(buffer, index).copy_(image)
    return resample_packed(buffer, plan, "cuda", dtype).cpu()


def test_kernel_random_images_bit_exact(transform_case, corpora):
    case = transform_case
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    assert assert_kernel_exact(corpora, case.preprocess, corpora.random(case.target), dtypes, against_cpu=True) >= 40


def test_kernel_real_photos_bit_exact(transform_case, corpora):
    case = transform_case
    assert assert_kernel_exact(corpora, case.preprocess, corpora.photos(case.target)) >= 50


@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_kernel_large_images_bit_exact(mode, interpolation, corpora):
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False, resize_mode=mode, interpolation=interpolation)
    corpus = [(f"{h}x{w}x{c}", corpora.random_image(h, w, c, seed=h + c))
              for h, w in corpora.large_sizes for c in (1, 3)]
    assert_kernel_exact(corpora, preprocess, corpus)


def test_kernel_huge_image_memory_bounded(corpora):
    """10000x8000 RGB (240 MB of pixels): device memory is the packed upload plus the output, nothing
    proportional to intermediate images."""
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False)
    array = corpora.random_image(8000, 10000, 3, seed=11)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    assert_kernel_exact(corpora, preprocess, [("huge", array)])
    peak = torch.cuda.max_memory_allocated() - before
    assert peak < array.nbytes + (64 << 20), f"peak {peak / 2**20:.0f} MiB for {array.nbytes / 2**20:.0f} MiB of pixels"


def test_kernel_pass_order_and_mixed_batch(corpora):
    """One launch with both pass orders, RGB, L and RGBA, padding, tiny and thin images together."""
    from open_clip.transform import image_transform

    from clip_flash.inputs.image.resample_plan import plan_image

    for mode in ("squash", "longest", "shortest"):
        preprocess = image_transform((224, 320), is_train=False, resize_mode=mode, fill_color=99)
        spec = spec_from_preprocess(preprocess)
        sizes = [(1000, 500), (640, 480), (480, 640), (3, 2), (1, 1), (2000, 300), (300, 2000), (224, 320), (225, 319),
                 (1500, 40)]
        corpus = [(f"{h}x{w}x{c}", corpora.random_image(h, w, c, seed=h * 7 + w + c)) for h, w in sizes for c in (1, 3)]
        corpus += [(f"{h}x{w}x4", corpora.with_alpha(corpora.random_image(h, w, 3, seed=h), seed=w)) for h, w in sizes]
        orders = set()
        for _, array in corpus:
            try:
                orders.add(plan_image(spec, *array.shape[:2]).vertical_first)
            except ValueError:
                pass
        assert_kernel_exact(corpora, preprocess, corpus)
        if mode == "squash":
            from clip_flash.inputs.image.resample_plan import PILLOW_MAJOR

            assert orders == ({True, False} if PILLOW_MAJOR >= 13 else {False})


def test_kernel_many_images_and_zero_copy_layout(corpora):
    """300 images through the layout API: decoders write straight into the pinned buffer's slots."""
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False)
    spec = spec_from_preprocess(preprocess)
    arrays = [corpora.random_image(100 + i % 37, 90 + (i * 13) % 71, 3 if i % 5 else 1, seed=i) for i in range(300)]
    plan = plan_batch([a.shape for a in arrays], spec)
    buffer = plan.allocate_host()
    for index, array in enumerate(arrays):
        plan.pixel_slot(buffer, index).copy_(torch.from_numpy(array))
    got = resample_packed(buffer, plan, "cuda", torch.float16).cpu()
    reference = torch.stack([preprocess(corpora.to_pil(a)) for a in arrays]).to(torch.float16)
    assert torch.equal(got, reference)
    empty = resample_batch([], spec, device="cuda")
    assert empty.shape == (0, 3, 224, 224)


def test_kernel_vertical_first_across_shared_memory_chunks(corpora):
    """Tall images wider than one shared-memory chunk (4096 columns): the vertical-first rows are built
    and consumed chunk by chunk (L and RGBA)."""
    from open_clip.transform import image_transform

    from clip_flash.inputs.image.resample_plan import PILLOW_MAJOR, plan_image

    preprocess = image_transform(224, is_train=False, resize_mode="squash")
    spec = spec_from_preprocess(preprocess)
    corpus = [("16000x4500x1", corpora.random_image(16000, 4500, 1, seed=1)),
              ("9000x4200x4", corpora.with_alpha(corpora.random_image(9000, 4200, 3, seed=2), seed=3))]
    for _, array in corpus:
        assert plan_image(spec, *array.shape[:2]).vertical_first == (PILLOW_MAJOR >= 13)
    assert_kernel_exact(corpora, preprocess, corpus, (torch.float32, torch.bfloat16))
    # Forced vertical first, so the chunks are exercised whatever the installed Pillow's order rule.
    for name, array in corpus:
        expected = corpora.reference_in_order(preprocess, array, True)
        assert torch.equal(kernel_in_order([torch.from_numpy(array)], spec, True)[0], expected), name


@pytest.mark.parametrize("vertical_first", [False, True], ids=["horizontal-first", "vertical-first"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("size", [224, (224, 320)], ids=["224", "224x320"])
def test_kernel_thin_images_in_both_pass_orders(mode, interpolation, size, vertical_first, corpora):
    """Thin and tiny L/RGB/RGBA images (the photo columns that once failed, 1-pixel-wide resized
    images padded to the crop, 1-tap passes) with the pass order forced: equal to Pillow's two one-axis
    resizes in that order, in float32 and float16, whatever the installed Pillow's own rule."""
    from open_clip.transform import image_transform

    preprocess = image_transform(size, is_train=False, resize_mode=mode, interpolation=interpolation, fill_color=77)
    spec = spec_from_preprocess(preprocess)
    names, images, references = [], [], []
    for index, (h, w) in enumerate(corpora.thin_sizes):
        rgb = corpora.random_image(h, w, 3, seed=index)
        for array in (rgb[:, :, :1], rgb, corpora.with_alpha(rgb, seed=index)):
            if isinstance(corpora.reference(preprocess, array), Exception):
                continue
            names.append(f"{h}x{w}x{array.shape[2]}")
            images.append(torch.from_numpy(array))
            references.append(corpora.reference_in_order(preprocess, array, vertical_first))
    assert len(names) >= 20
    reference = torch.stack(references)
    for dtype in (torch.float32, torch.float16):
        got = kernel_in_order(images, spec, vertical_first, dtype)
        bad = [f"{n}: {(g != r).sum().item()}" for n, g, r in zip(names, got, reference.to(dtype))
               if not torch.equal(g, r)]
        assert not bad, f"{dtype}: " + ", ".join(bad)
