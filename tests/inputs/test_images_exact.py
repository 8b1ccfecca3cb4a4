"""ImagePreprocessor on the CPU equals OpenCLIP's ``preprocess(Image.open(p))`` bit for bit, on real photos."""
from __future__ import annotations

import logging

import open_clip
import pytest
import torch
from PIL import Image

import clip_flash
from clip_flash.inputs.image.decoder_check import decoder_agreement
from photo_corpus import assert_same_as_reference


@pytest.fixture(scope="module")
def cpu_prep(vit_b32_preprocess):
    prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2)
    yield prep
    prep.close()


def test_torchvision_decoders_agree_with_pillow_here():
    agreement = decoder_agreement()
    assert agreement.jpeg and agreement.png, agreement.details


@pytest.mark.parametrize("resize", ["pillow", "torch"])
def test_photo_corpus_bit_identical(vit_b32_preprocess, photo_files, resize):
    """Both CPU resize implementations (Pillow itself; clip_flash's fixed-point PyTorch, the kernel's
    reference) behind the decoders and routes of the ImagePreprocessor."""
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      resize=resize) as prep:
        assert prep.resize.implementation == resize
        prepared = prep(photo_files)
    assert_same_as_reference(prepared, vit_b32_preprocess, photo_files)
    assert prepared.pixels.dtype == torch.float32 and prepared.pixels.shape[1:] == (3, 224, 224)


def test_photos_take_the_fast_routes(cpu_prep, photo_files):
    """RGB/L JPEGs and plain PNGs are decoded by libjpeg-turbo/libpng, not by Pillow: the exact test above
    would pass on the slow routes too, so check the routes themselves."""
    decoded = cpu_prep.decode(photo_files)
    route = {photo_files[item.index].name: item.route for item in decoded.items}
    jpegs = [name for name in route if name.endswith(".jpg") and "cmyk" not in name]
    assert jpegs and all(route[name] == "jpeg" for name in jpegs), route
    assert route["png_rgb.png"] == route["png_l.png"] == "png"
    assert route["png_l_trns.png"] == route["webp_rgb.webp"] == route["bmp_rgb.bmp"] == "pillow-pixels"
    for name in ("png_rgba.png", "png_la.png", "png_p.png", "png_1bit.png", "jpeg_cmyk.jpg", "png_16bit.png"):
        assert route[name] == "pillow-preprocess", (name, route[name])


def test_special_modes_are_logged_at_debug(cpu_prep, photo_files, caplog):
    rgba = [path for path in photo_files if path.name == "png_rgba.png"]
    with caplog.at_level(logging.DEBUG, logger="clip_flash.inputs"):
        cpu_prep(rgba)
    assert any("mode RGBA" in record.getMessage() and "preprocess" in record.getMessage()
               for record in caplog.records)


@pytest.mark.parametrize("options", [
    {"resize_mode": "longest"},
    {"resize_mode": "squash"},
    {"interpolation": "bilinear"},
    {"resize_mode": "longest", "fill_color": 0, "interpolation": "bilinear"},
    {"image_size": (256, 192)},
    {"image_size": 336, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)},
])
def test_transform_variants_bit_identical(options, photo_files):
    """Every resize_mode and interpolation OpenCLIP configs use, on a slice of the corpus."""
    size = options.pop("image_size", 224)
    preprocess = open_clip.image_transform(size, is_train=False, **options)
    paths = [path for path in photo_files if path.suffix == ".jpg"][::4] + \
        [path for path in photo_files if path.name in ("png_l.png", "png_rgba.png")]
    with clip_flash.ImagePreprocessor(preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      resize="torch") as prep:
        assert_same_as_reference(prep(paths), preprocess, paths)


def test_dtype_is_the_reference_cast(vit_b32_preprocess, photo_files):
    paths = photo_files[:6]
    for dtype in (torch.bfloat16, torch.float16):
        with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=dtype, workers=2) as prep:
            prepared = prep(paths)
        assert prepared.pixels.dtype == dtype
        assert_same_as_reference(prepared, vit_b32_preprocess, paths, dtype=dtype)


@pytest.mark.parametrize("executor", ["auto", "thread"])
def test_executors_give_the_same_rows(vit_b32_preprocess, photo_files, executor):
    """The native decoder (where built) and Python threads: the reference's rows, the same failures."""
    paths = photo_files[:10] + ["/nonexistent/file.jpg"]
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor=executor) as prep:
        prepared = prep(paths + [Image.open(photo_files[0])])
    assert_same_as_reference(prepared, vit_b32_preprocess, paths + [Image.open(photo_files[0])])
    assert prepared.failures[0][0] == 10 and "FileNotFoundError" in prepared.failures[0][1]


def test_refuses_options_it_does_not_know(vit_b32_preprocess):
    with pytest.raises(ValueError, match="decode"):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", decode="fast")
    with pytest.raises(ValueError, match="CUDA"):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", decode="gpu")
    with pytest.raises(ValueError, match="executor"):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", executor="fiber")
    with pytest.raises(ValueError, match="floating"):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.uint8)
    with pytest.raises(ValueError, match="resize"):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", resize="nearest")


def test_refuses_transforms_it_cannot_reproduce(vit_b32_preprocess):
    """A transform that is not OpenCLIP's eval shape is refused with a clear error, not approximated."""
    from torchvision import transforms

    from clip_flash.inputs.image.transform_spec import UnsupportedTransformError

    training = open_clip.image_transform(224, is_train=True)
    nearest = transforms.Compose([transforms.Resize(224, interpolation=transforms.InterpolationMode.NEAREST),
                                  *vit_b32_preprocess.transforms[1:]])
    for transform in (training, nearest):
        with pytest.raises(UnsupportedTransformError):
            clip_flash.ImagePreprocessor(transform, device="cpu")


def test_a_pillow_that_computes_otherwise_means_pillow_resizes(vit_b32_preprocess, photo_files, monkeypatch, caplog):
    """If the installed Pillow's arithmetic ever differs from what the kernel models, 'auto' lets Pillow
    itself resize (still exact, with a warning) and an explicit 'torch'/'kernel' is refused."""
    from clip_flash.inputs.image import image_resize
    from clip_flash.inputs.image.pillow_resample import PillowMismatchError

    monkeypatch.setattr(image_resize, "pillow_mismatch", lambda: "Pillow 99 resizes differently")
    with caplog.at_level(logging.WARNING, logger="clip_flash.inputs"):
        with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
            assert prep.resize.implementation == "pillow"
            assert_same_as_reference(prep(photo_files[:3]), vit_b32_preprocess, photo_files[:3])
    assert any("Pillow 99" in record.getMessage() for record in caplog.records)
    with pytest.raises(PillowMismatchError):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", resize="torch")
