"""The CPU implementation of OpenCLIP's eval transform is bit-identical to ``preprocess(pil_image)``.

Differential: every resize mode x interpolation x target size OpenCLIP builds, over random-content
images of awkward sizes (1x1, strips, the target size and one pixel around it, upscales, web sizes,
large downscales) and real photos, in RGB and L. Images the reference refuses must be refused too.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from clip_flash.inputs.image.pillow_resample import preprocess_batch_cpu, resample_image, to_model_input
from clip_flash.inputs.image.resample_plan import ImageTooSmallError, plan_image, resized_size
from clip_flash.inputs.image.transform_spec import spec_from_preprocess


pytestmark = pytest.mark.usefixtures("single_thread_torch")


def assert_corpus_exact(corpora, preprocess, corpus, dtype=torch.float32) -> int:
    """Compare every image of ``corpus`` against the reference; returns how many were compared.

    The images the reference accepts go through one batched call (so batching is tested too); each one
    it refuses must be refused by ours with ImageTooSmallError.
    """
    spec = spec_from_preprocess(preprocess)
    accepted, references, mismatches = [], [], []
    for name, array in corpus:
        expected = corpora.reference(preprocess, array)
        if isinstance(expected, Exception):
            with pytest.raises(ImageTooSmallError):
                preprocess_batch_cpu([torch.from_numpy(array)], spec)
            assert isinstance(expected, ValueError), f"{name}: reference failed unexpectedly: {expected!r}"
            continue
        accepted.append((name, array))
        references.append(expected.to(dtype))
    if accepted:
        ours = preprocess_batch_cpu([torch.tensor(a) for _, a in accepted], spec, dtype=dtype)
        for (name, array), expected, got in zip(accepted, references, ours):
            if not torch.equal(expected, got):
                differing = (expected != got).sum().item()
                mismatches.append(f"{name} {array.shape}: {differing} values differ")
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} images differ:\n" + "\n".join(mismatches[:20])
    return len(corpus)


def test_random_images_bit_exact(transform_case, corpora):
    case = transform_case
    assert assert_corpus_exact(corpora, case.preprocess, corpora.random(case.target)) >= 50


def test_real_photos_bit_exact(transform_case, corpora):
    """Half the photo variants per case, alternating, so every variant meets every mode and filter."""
    case = transform_case
    corpus = corpora.photos(case.target, share=(case.index % 2, 2))
    assert assert_corpus_exact(corpora, case.preprocess, corpus) >= 30


@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_large_downscales_bit_exact(mode, interpolation, corpora):
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False, resize_mode=mode, interpolation=interpolation)
    corpus = [(f"large{h}x{w}", corpora.random_image(h, w, 3 if h < w else 1, seed=h)) for h, w in corpora.large_sizes]
    assert_corpus_exact(corpora, preprocess, corpus)


def test_huge_grey_image_bit_exact(corpora):
    """A 10000x8000 image: Pillow's widest filters (145 taps at bicubic, 3 x 35.7 downscale)."""
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False)
    assert_corpus_exact(corpora, preprocess, [("huge8000x10000", corpora.random_image(8000, 10000, 1, seed=7))])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
def test_dtype_cast_equals_reference_cast(dtype, mode, corpora):
    from open_clip.transform import image_transform

    preprocess = image_transform(256, is_train=False, resize_mode=mode)
    corpus = corpora.random((256, 256))[::3] + corpora.photos((256, 256))[::4]
    assert_corpus_exact(corpora, preprocess, corpus, dtype=dtype)


@pytest.mark.parametrize("fill", [0, 128, 255])
def test_longest_pads_with_fill_colour(fill, corpora):
    """CenterCropOrPad pads with fill_color before the RGB conversion; one-channel images included."""
    from open_clip.transform import image_transform

    preprocess = image_transform(
        (224, 320), is_train=False, resize_mode="longest", fill_color=fill, mean=(0.1, 0.2, 0.3), std=(0.9, 0.8, 0.7)
    )
    spec = spec_from_preprocess(preprocess)
    assert spec.fill == fill
    corpus = [(f"{h}x{w}x{c}", corpora.random_image(h, w, c, seed=h * w + c))
              for h, w in ((100, 50), (50, 100), (224, 100), (17, 301), (400, 90)) for c in (1, 3)]
    assert_corpus_exact(corpora, preprocess, corpus)


def test_longest_refuses_what_pillow_refuses(corpora):
    """'longest' resizes a 1x1000 image to 0 rows: Pillow raises, and so must we (before any work)."""
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False, resize_mode="longest")
    spec = spec_from_preprocess(preprocess)
    assert resized_size(spec, 1, 1000) == (0, 224)
    with pytest.raises(ImageTooSmallError):
        plan_image(spec, 1, 1000)
    with pytest.raises(ValueError):
        preprocess(corpora.to_pil(corpora.random_image(1, 1000, 3, seed=0)))


def test_plan_skips_unchanged_axis_like_pillow(corpora):
    """A squash to the image's own width leaves that axis alone (Pillow skips the pass): one tap of 1.0."""
    from open_clip.transform import image_transform

    preprocess = image_transform((224, 320), is_train=False, resize_mode="squash")
    spec = spec_from_preprocess(preprocess)
    plan = plan_image(spec, 500, 320)
    assert plan.cols.taps == 1 and (plan.cols.start == np.arange(320)).all()
    assert plan.rows.taps > 1
    assert_corpus_exact(corpora, preprocess, [("squash-width", corpora.random_image(500, 320, 3, seed=3))])


def test_resample_image_checks_its_input():
    from open_clip.transform import image_transform

    spec = spec_from_preprocess(image_transform(224, is_train=False))
    plan = plan_image(spec, 10, 10)
    with pytest.raises(ValueError):
        resample_image(torch.zeros(10, 10, 2, dtype=torch.uint8), plan)
    with pytest.raises(ValueError):
        resample_image(torch.zeros(10, 10, 3, dtype=torch.float32), plan)
    with pytest.raises(ValueError):
        resample_image(torch.zeros(10, 11, 3, dtype=torch.uint8), plan)
    pixels = resample_image(torch.zeros(10, 10, 3, dtype=torch.uint8), plan)
    assert pixels.shape == (3, 224, 224) and pixels.dtype == torch.uint8
    assert to_model_input(pixels, spec).dtype == torch.float32


def test_pass_order_follows_pillow_at_the_boundary(corpora):
    """Pillow runs the vertical pass first when the height shrinks by more than twice the width's
    shrink; the uint8 intermediate makes the order visible. Squash targets straddle that boundary
    (equal, one under, one over, width growing, height growing)."""
    from open_clip.transform import image_transform

    from clip_flash.inputs.image.resample_plan import pillow_vertical_first

    cases = []
    for in_h, in_w, out_w in ((300, 120, 100), (250, 90, 60), (97, 301, 290), (500, 40, 70)):
        for delta in (-1, 0, 1):
            out_h = in_h - 2 * (in_w - out_w) + delta
            if 0 < out_h != in_h:
                cases.append((in_h, in_w, out_h, out_w))
    cases += [(60, 80, 90, 70), (60, 80, 50, 120), (400, 90, 224, 50)]
    from clip_flash.inputs.image.resample_plan import PILLOW_MAJOR

    orders = {pillow_vertical_first((a, b), (c, d)) for a, b, c, d in cases}
    assert orders == ({True, False} if PILLOW_MAJOR >= 13 else {False})
    for index, (in_h, in_w, out_h, out_w) in enumerate(cases):
        for interpolation in ("bicubic", "bilinear"):
            preprocess = image_transform((out_h, out_w), is_train=False, resize_mode="squash",
                                         interpolation=interpolation)
            image = corpora.random_image(in_h, in_w, 3, seed=index)
            assert_corpus_exact(corpora, preprocess, [(f"{in_h}x{in_w}->{out_h}x{out_w}", image)])


def test_installed_pillow_agrees_with_the_model():
    from clip_flash.inputs.image.pillow_resample import pillow_disagreement

    assert pillow_disagreement() is None


def test_self_check_catches_other_arithmetic(monkeypatch):
    """With the pass order flipped (what a Pillow of other arithmetic would look like) it reports it."""
    import clip_flash.inputs.image.resample_plan as resample_plan
    from clip_flash.inputs.image.pillow_resample import pillow_disagreement

    monkeypatch.setattr(resample_plan, "pillow_vertical_first", lambda source, resized: not (
        resized[1] != source[1] and resized[0] != source[0]
        and 0 < source[0] - resized[0] > 2 * (source[1] - resized[1])))
    assert "differently" in (pillow_disagreement() or "")


@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
def test_la_images_are_rgba_with_grey_colours(mode, corpora):
    """An "LA" image goes through OpenCLIP's transform as the RGBA image (L, L, L, A) does (documented
    in resample_batch): our RGBA path on the expanded pixels equals preprocess(la_image)."""
    from open_clip.transform import image_transform
    from PIL import Image

    preprocess = image_transform((224, 320), is_train=False, resize_mode=mode, fill_color=5)
    spec = spec_from_preprocess(preprocess)
    for h, w in ((300, 400), (1000, 300), (50, 60), (224, 320)):
        rgba = corpora.with_alpha(corpora.random_image(h, w, 3, seed=h), seed=w)
        grey, alpha = rgba[:, :, 0], rgba[:, :, 3]
        la_image = Image.fromarray(np.stack([grey, alpha], axis=2), "LA")
        expanded = torch.from_numpy(np.stack([grey, grey, grey, alpha], axis=2))
        assert torch.equal(preprocess_batch_cpu([expanded], spec)[0], preprocess(la_image))
