"""``spec_from_preprocess`` reads exactly OpenCLIP's eval transforms and refuses everything else."""
from __future__ import annotations

import pytest
import torch
from open_clip.transform import CenterCropOrPad, PreprocessCfg, ResizeKeepRatio, image_transform, image_transform_v2
from torchvision import transforms as T

from clip_flash.inputs.image.transform_spec import ImageTransformSpec, UnsupportedTransformError, spec_from_preprocess

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", [224, 384, (256, 320)])
def test_reads_every_open_clip_eval_shape(mode, interpolation, size):
    preprocess = image_transform(size, is_train=False, resize_mode=mode, interpolation=interpolation, fill_color=7)
    spec = spec_from_preprocess(preprocess)
    pair = size if isinstance(size, tuple) else (size, size)
    assert spec.size == pair and spec.resize_mode == mode
    assert spec.mean == OPENAI_MEAN and spec.std == OPENAI_STD
    assert spec.fill == (7 if mode == "longest" else 0)
    if mode == "shortest" and isinstance(size, tuple):
        # OpenCLIP builds ResizeKeepRatio(size) without passing the interpolation: it resizes bicubic.
        assert spec.interpolation == "bicubic" and spec.resize_rule == "keep_ratio"
    else:
        assert spec.interpolation == interpolation
    if mode == "shortest" and not isinstance(size, tuple):
        assert spec.resize_rule == "torchvision_short_side"


def test_reads_a_pretrained_config():
    cfg = PreprocessCfg(size=256, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bilinear",
                        resize_mode="squash")
    spec = spec_from_preprocess(image_transform_v2(cfg, is_train=False))
    assert spec == ImageTransformSpec((256, 256), "squash", "bilinear", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def _with_steps(*steps):
    return T.Compose(list(steps))


def _tail():
    base = image_transform(224, is_train=False)
    return list(base.transforms[2:])  # convert, ToTensor, Normalize


@pytest.mark.parametrize(
    "build, offending",
    [
        (lambda: image_transform(224, is_train=True), "RandomResizedCrop"),
        (lambda: T.Compose(image_transform(224, is_train=False).transforms + [T.RandomHorizontalFlip()]),
         "RandomHorizontalFlip"),
        (lambda: _with_steps(T.Resize(224, max_size=300), T.CenterCrop(224), *_tail()), "max_size"),
        (lambda: _with_steps(T.Resize(224, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop(224), *_tail()),
         "interpolation"),
        (lambda: _with_steps(T.Resize(256), T.CenterCrop(224), *_tail()), "crops to the resize size"),
        (lambda: _with_steps(T.Resize((224, 224)), T.CenterCrop(224), *_tail()), "not an OpenCLIP eval shape"),
        (lambda: _with_steps(ResizeKeepRatio(224), T.CenterCrop(224), *_tail()), "the other way"),
        (lambda: _with_steps(ResizeKeepRatio((224, 320), random_scale_prob=0.5), T.CenterCrop((224, 320)), *_tail()),
         "random"),
        (lambda: _with_steps(ResizeKeepRatio(224, longest=1), T.CenterCrop(224), *_tail()), "CenterCropOrPad"),
        (lambda: _with_steps(ResizeKeepRatio(224, longest=1), CenterCropOrPad(224, fill=(1, 2, 3)), *_tail()), "fill"),
        (lambda: _with_steps(T.Resize(224), *_tail()), "without a crop"),
        (lambda: _with_steps(T.Resize(224), T.CenterCrop(224), T.Grayscale(3), *_tail()), "at most one crop"),
        (lambda: _with_steps(T.Resize(224), T.CenterCrop(224), _tail()[0], _tail()[1]), "expected Normalize"),
        (lambda: _with_steps(T.Resize(224), T.CenterCrop(224), *_tail()[:2], T.Normalize((0.5,) * 3, (0.5, 0.0, 0.5))),
         "zero std"),
        (lambda: _with_steps(T.Resize(224), T.CenterCrop(224), T.Lambda(lambda im: im), *_tail()[1:]), "convert"),
        (lambda: image_transform(224, is_train=False).transforms, "Compose"),
    ],
)
def test_refuses_what_it_cannot_reproduce(build, offending):
    with pytest.raises(UnsupportedTransformError, match=offending):
        spec_from_preprocess(build())


def test_refuses_a_non_float32_default_dtype():
    preprocess = image_transform(224, is_train=False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(UnsupportedTransformError, match="float32"):
            spec_from_preprocess(preprocess)
    finally:
        torch.set_default_dtype(previous)


def test_spec_validates_its_fields():
    good = dict(size=(224, 224), resize_mode="shortest", interpolation="bicubic", mean=(0.5,) * 3, std=(0.5,) * 3)
    assert ImageTransformSpec(**good).resize_rule == "torchvision_short_side"
    assert ImageTransformSpec(**{**good, "size": (224, 320)}).resize_rule == "keep_ratio"
    for bad in ({"size": (0, 224)}, {"resize_mode": "crop"}, {"interpolation": "nearest"}, {"std": (0.5, 0.0, 0.5)},
                {"fill": 256}, {"resize_rule": "exact"}, {"mean": (0.5, 0.5)}):
        with pytest.raises(ValueError):
            ImageTransformSpec(**{**good, **bad})


@pytest.mark.parametrize("kwargs, expected", [
    ({}, ((224, 224), "shortest", "torchvision_short_side")),
    ({"force_image_size": (224, 288)}, ((224, 288), "shortest", "keep_ratio")),
    ({"image_resize_mode": "longest", "image_interpolation": "bilinear"}, ((224, 224), "longest", "keep_ratio")),
])
def test_reads_what_create_model_and_transforms_returns(kwargs, expected):
    import open_clip

    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None, **kwargs)
    spec = spec_from_preprocess(preprocess)
    assert (spec.size, spec.resize_mode, spec.resize_rule) == expected
