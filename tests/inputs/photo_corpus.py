"""Real photos re-encoded many ways (scikit-image's bundled samples) and the reference they are judged by (the
ImagePreprocessor tests; the resample tests' corpora are in image_corpus.py)."""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import pytest
import torch
from PIL import Image

SKIMAGE_PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
                  "hubble_deep_field.jpg", "camera.png", "retina.jpg", "ihc.png"]


REPO_ROOT = Path(__file__).resolve().parents[2]


def _photo_folder() -> Optional[Path]:
    """Where real photos are when scikit-image is not installed (the GPU machine): CLIP_FLASH_PHOTOS or
    the benchmark's .device/photos."""
    for candidate in (os.environ.get("CLIP_FLASH_PHOTOS"), REPO_ROOT / ".device" / "photos"):
        if candidate and Path(candidate).is_dir() and any(Path(candidate).iterdir()):
            return Path(candidate)
    return None


def skimage_photo(name: str) -> Image.Image:
    """One of the real sample photos scikit-image ships (read straight from its data folder); without
    scikit-image, a photo of the benchmark folder stands in (chosen by the name's position)."""
    try:
        import skimage
        path = Path(os.path.dirname(skimage.__file__)) / "data" / name
    except ImportError:
        folder = _photo_folder()
        if folder is None:
            pytest.skip("needs scikit-image's sample photos or a photo folder (CLIP_FLASH_PHOTOS)")
        files = sorted(path for path in folder.iterdir() if path.suffix.lower() in (".jpg", ".jpeg", ".png"))
        path = files[SKIMAGE_PHOTOS.index(name) % len(files)] if name in SKIMAGE_PHOTOS else files[0]
    with Image.open(path) as image:
        image.load()
        return image


def _save(image: Image.Image, path: Path, form: str, **options) -> Path:
    image.save(path, form, **options)
    return path


def build_photo_corpus(directory: Path) -> List[Path]:
    """Real photos at several sizes, JPEG qualities, subsamplings, progressive, grayscale, PNG modes."""
    directory.mkdir(parents=True, exist_ok=True)
    photos = {name: skimage_photo(name) for name in SKIMAGE_PHOTOS}
    rgb = {name: image.convert("RGB") for name, image in photos.items()}
    sizes = [(640, 480), (480, 640), (223, 224), (224, 224), (97, 61), (1024, 768), (301, 1003), (500, 375)]
    jpeg_options = [
        {"quality": 90, "subsampling": 2},  # 4:2:0, the web's usual
        {"quality": 85, "subsampling": 1},  # 4:2:2
        {"quality": 95, "subsampling": 0},  # 4:4:4
        {"quality": 75, "progressive": True},
        {"quality": 50, "optimize": True},
        {"quality": 100, "subsampling": 2},
        {"quality": 90, "keep_rgb": True},  # stored as RGB, no YCbCr
    ]
    paths: List[Path] = []
    names = sorted(rgb)
    for number, size in enumerate(sizes):
        name = names[number % len(names)]
        image = rgb[name].resize(size, Image.BICUBIC)
        for option_number, options in enumerate(jpeg_options):
            if (number + option_number) % 2:  # half the grid keeps the suite fast; every option still runs
                continue
            paths.append(_save(image, directory / f"{name[:-4]}_{size[0]}x{size[1]}_{option_number}.jpg",
                               "JPEG", **options))
        paths.append(_save(image.convert("L"), directory / f"{name[:-4]}_{size[0]}x{size[1]}_gray.jpg",
                           "JPEG", quality=90))
    for name in names:  # the photos at their own sizes
        paths.append(_save(rgb[name], directory / f"{name[:-4]}_full.jpg", "JPEG", quality=92))
    astronaut = rgb["astronaut.png"].resize((320, 240), Image.BICUBIC)
    alpha = Image.linear_gradient("L").resize(astronaut.size)
    rgba = astronaut.copy()
    rgba.putalpha(alpha)
    paths += [
        _save(astronaut, directory / "png_rgb.png", "PNG"),
        _save(astronaut.convert("L"), directory / "png_l.png", "PNG"),
        _save(rgba, directory / "png_rgba.png", "PNG"),
        _save(astronaut.convert("LA"), directory / "png_la.png", "PNG"),
        _save(astronaut.convert("P", palette=Image.ADAPTIVE), directory / "png_p.png", "PNG"),
        _save(astronaut.convert("1"), directory / "png_1bit.png", "PNG"),
        _save(astronaut.convert("L"), directory / "png_l_trns.png", "PNG", transparency=17),
        _save(astronaut, directory / "webp_rgb.webp", "WEBP", quality=80),
        _save(astronaut, directory / "bmp_rgb.bmp", "BMP"),
        _save(astronaut.convert("CMYK"), directory / "jpeg_cmyk.jpg", "JPEG", quality=90),
        _save(astronaut, directory / "tiff_rgb.tif", "TIFF"),
    ]
    sixteen = Image.fromarray(np.asarray(astronaut.convert("L"), dtype=np.uint16) * 257)
    paths.append(_save(sixteen, directory / "png_16bit.png", "PNG"))
    return paths


def reference_batch(preprocess: Callable, items) -> tuple:
    """``preprocess(Image.open(item))`` per input, or the exception Pillow raised: (rows, failed indices)."""
    rows, failed = [], []
    for index, item in enumerate(items):
        try:
            if isinstance(item, (str, os.PathLike)):
                image = Image.open(item)
            elif isinstance(item, bytes):
                image = Image.open(io.BytesIO(item))
            else:
                image = item
            rows.append(preprocess(image))
        except Exception:  # noqa: BLE001 - the reference's failures are what we compare against
            failed.append(index)
    return rows, failed


def assert_same_as_reference(prepared, preprocess: Callable, items, dtype: Optional[torch.dtype] = None) -> None:
    """The prepared batch equals the reference row for row (cast to ``dtype``), failures included."""
    rows, failed = reference_batch(preprocess, items)
    assert [index for index, _ in prepared.failures] == failed, prepared.failures
    assert prepared.indices == [index for index in range(len(items)) if index not in failed]
    assert len(rows) == prepared.pixels.shape[0]
    for row, (index, expected) in enumerate(zip(prepared.indices, rows)):
        expected = expected if dtype is None else expected.to(dtype)
        actual = prepared.pixels[row].cpu()
        if not torch.equal(actual, expected):
            difference = (actual.float() - expected.float()).abs().max().item()
            raise AssertionError(f"input {index} ({items[index]}): max |difference| {difference}")
