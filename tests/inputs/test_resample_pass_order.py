"""Pillow's pass order, forced both ways, on thin and tiny images: the CPU implementation and the
emulated kernel walk give Pillow's pixels in either order, and the order rule follows the installed Pillow.

The GPU once disagreed with ``preprocess(pil)`` on real-photo columns (512x2 -> 224x1 under "longest"):
the kernel was right, but the plan assumed horizontal-first for every Pillow before 13, while Pillow 12.2
and 12.3 resize images more than 100x taller than wide vertically first. These tests pin both orders
independently of the installed Pillow (its one-axis resizes are the same in every version).
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import clip_flash.inputs.image.resample_plan as resample_plan
import clip_flash.ops.image_resample as image_resample_module
from clip_flash.inputs.image.pillow_resample import (
    SELF_CHECK_RESIZES, pillow_disagreement, resample_image, to_model_input,
)
from clip_flash.inputs.image.resample_plan import PILLOW_VERSION, plan_image, pillow_vertical_first
from clip_flash.inputs.image.transform_spec import spec_from_preprocess
from clip_flash.ops.image_resample import META_FIELDS, plan_batch
from image_corpus import INTERPOLATIONS, RESIZE_MODES
from test_image_resample_packing import EmulatedExtension

VERSIONS = ((12, 1), (12, 2), (13, 0))


def _thin_corpus(corpora, preprocess):
    """(name, array) for every thin size in L, RGB and RGBA that the transform accepts."""
    corpus = []
    for index, (h, w) in enumerate(corpora.thin_sizes):
        rgb = corpora.random_image(h, w, 3, seed=index)
        for array in (rgb[:, :, :1], rgb, corpora.with_alpha(rgb, seed=index)):
            if not isinstance(corpora.reference(preprocess, array), Exception):
                corpus.append((f"{h}x{w}x{array.shape[2]}", array))
    return corpus


@pytest.mark.parametrize("vertical_first", [False, True], ids=["horizontal-first", "vertical-first"])
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
# OpenCLIP's default resize mode in CI; the others with --run-slow (the resample tests cover them at each order).
@pytest.mark.parametrize("mode", [mode if mode == "shortest" else pytest.param(mode, marks=pytest.mark.slow)
                                  for mode in RESIZE_MODES])
def test_forced_order_cpu_and_emulated_kernel(mode, interpolation, vertical_first, corpora, monkeypatch,
                                              single_thread_torch):
    """Every mode x filter x order on thin/tiny L, RGB and RGBA images (padding wider than the image,
    one-pixel-wide resized images, 1-tap identity passes): CPU path and kernel emulation both exact."""
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False, resize_mode=mode, interpolation=interpolation, fill_color=77)
    spec = spec_from_preprocess(preprocess)
    corpus = _thin_corpus(corpora, preprocess)
    assert len(corpus) >= 20
    references = torch.stack([corpora.reference_in_order(preprocess, a, vertical_first) for _, a in corpus])
    for (name, array), expected in zip(corpus, references):
        plan = dataclasses.replace(plan_image(spec, *array.shape[:2]), vertical_first=vertical_first)
        got = to_model_input(resample_image(torch.from_numpy(array), plan), spec)
        assert torch.equal(got, expected), f"CPU path, {name}: {(got != expected).sum().item()} values differ"
    plan = plan_batch([a.shape for _, a in corpus], spec)
    meta = plan.meta.copy()  # plans are read-only (shared through plan_batch's cache): a forced-order copy
    meta[:, META_FIELDS.index("vertical_first")] = int(vertical_first)
    plan = dataclasses.replace(plan, meta=meta)
    buffer = plan.allocate_host(pin=False)
    for index, (_, array) in enumerate(corpus):
        plan.pixel_slot(buffer, index).copy_(torch.from_numpy(array))
    monkeypatch.setattr(image_resample_module, "load_extension", lambda: EmulatedExtension(4096))
    got = image_resample_module.resample_packed(buffer, plan, "cpu", torch.float32)
    bad = [f"{name}: {(g != r).sum().item()}" for (name, _), g, r in zip(corpus, got, references)
           if not torch.equal(g, r)]
    assert not bad, "emulated kernel differs: " + ", ".join(bad)


def test_the_gpu_failures_were_a_pass_order_mismatch(corpora):
    """The photo columns that failed on the first GPU run (their mismatch counts there equal the counts
    by which the two orders differ) are the ones Pillow 12.2's rule runs vertically first; the plan
    used to say horizontal for every Pillow before 13. The columns that passed are under 100x."""
    from open_clip.transform import image_transform

    preprocess = image_transform(224, is_train=False, resize_mode="longest")
    shapes = ((512, 2), (400, 3), (872, 6), (512, 4), (512, 5))
    for h, w in shapes:
        resized = plan_image(spec_from_preprocess(preprocess), h, w).resized_size
        assert pillow_vertical_first((h, w), resized, (12, 2)) and not pillow_vertical_first((h, w), resized, (12, 1))
    for h, w in ((300, 4), (427, 5), (303, 6)):  # the columns that passed: under 100x, horizontal in 12.2
        resized = plan_image(spec_from_preprocess(preprocess), h, w).resized_size
        assert not pillow_vertical_first((h, w), resized, (12, 2))


@pytest.mark.parametrize("version", VERSIONS)
def test_order_rule_per_pillow_version(version):
    rule = functools.partial(pillow_vertical_first, pillow_version=version)
    assert not rule((480, 640), (224, 298))                  # web photo: horizontal first everywhere
    assert rule((512, 2), (224, 1)) == (version >= (12, 2))  # a column: vertical first from 12.2
    assert rule((61, 20), (19, 17)) == (version >= (13, 0))  # height shrinks > 2x the width's shrink
    assert rule((403, 4), (400, 1)) == (version == (12, 2))  # tall, but the width shrinks more


def test_self_check_tells_the_order_rules_apart(monkeypatch):
    """The installed Pillow agrees with its own rule, and the self-check catches each other version's
    rule (so a GPU machine with another Pillow is refused, not silently off by a level)."""
    assert pillow_disagreement() is None
    original = resample_plan.pillow_vertical_first
    for version in VERSIONS:
        rule = functools.partial(original, pillow_version=version)
        if all(rule(s[:2], s[2:]) == original(s[:2], s[2:]) for s in SELF_CHECK_RESIZES):
            continue  # the installed Pillow's own rule
        monkeypatch.setattr(resample_plan, "pillow_vertical_first", rule)
        assert "differently" in (pillow_disagreement() or ""), version
    monkeypatch.setattr(resample_plan, "pillow_vertical_first", original)
    assert PILLOW_VERSION >= (12, 2) or not original((512, 2), (224, 1))
