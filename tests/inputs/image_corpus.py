"""Corpora and fixtures for the image-resample exactness tests: every OpenCLIP eval transform shape, and
images of awkward sizes with random content (hides no rounding bug) and real photos (scikit-image's
samples). A plain module, not a conftest.py: the root tests import their helpers with ``from conftest
import ...``, which a second conftest module would shadow. Test modules import the fixtures by name."""
from __future__ import annotations

import functools
import types
from pathlib import Path
from typing import List, NamedTuple, Tuple

import numpy as np
import pytest
import torch
from PIL import Image

RESIZE_MODES = ("shortest", "longest", "squash")
INTERPOLATIONS = ("bicubic", "bilinear")
# Square sizes of OpenCLIP's configs, plus (h, w) sizes (force_image_size=(h, w)) both ways round.
TARGET_SIZES = (224, 256, 336, 384, (224, 320), (320, 224))
TRANSFORM_CASES = [(m, i, s) for m in RESIZE_MODES for i in INTERPOLATIONS for s in TARGET_SIZES]

# Sizes (height, width) independent of the target: single pixels, thin strips, upscales, web sizes.
ABSOLUTE_SIZES = (
    (1, 1), (2, 3), (3, 2), (1, 9), (7, 1), (1, 300), (300, 1), (2, 500), (16, 16), (17, 23), (50, 80),
    (80, 50), (123, 457), (457, 123), (240, 320), (480, 640), (640, 480), (333, 517), (768, 1024),
    (1001, 999),
)
LARGE_SIZES = ((3000, 4000), (4000, 3000))
Named = Tuple[str, np.ndarray]


def case_id(case) -> str:
    mode, interpolation, size = case
    size_text = f"{size[0]}x{size[1]}" if isinstance(size, tuple) else str(size)
    return f"{mode}-{interpolation}-{size_text}"


def pair(size) -> Tuple[int, int]:
    return tuple(size) if isinstance(size, tuple) else (size, size)


def sizes_around(target: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The target itself, one pixel over and under on either side, and a near-2x downscale."""
    h, w = target
    return [(h, w), (h + 1, w + 1), (h - 1, w - 1), (h + 1, w), (h, w - 1), (h - 1, w + 1), (2 * h + 1, 2 * w - 1)]


def random_image(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, channels), dtype=np.uint8)


def with_alpha(rgb: np.ndarray, seed: int) -> np.ndarray:
    """RGBA: an alpha channel mixing fully transparent, opaque, and every level in between."""
    rng = np.random.default_rng(seed)
    h, w = rgb.shape[:2]
    ramp = (np.arange(w)[None, :] * 255 // max(w - 1, 1)).repeat(h, axis=0)
    alpha = np.where(rng.random((h, w)) < 0.3, rng.choice([0, 255], size=(h, w)), ramp).astype(np.uint8)
    return np.concatenate([rgb, alpha[:, :, None]], axis=2)


def random_corpus(target: Tuple[int, int]) -> List[Named]:
    """Uniform random pixels at every awkward size, RGB and L (RGBA for every third size), plus a 0/255
    checkerboard (maximal overshoot: bicubic clips at both ends)."""
    corpus = []
    for index, (h, w) in enumerate(list(ABSOLUTE_SIZES) + sizes_around(target)):
        for channels in (3, 1):
            corpus.append((f"random{h}x{w}x{channels}", random_image(h, w, channels, seed=index * 2 + channels)))
        if index % 3 == 0:
            corpus.append((f"random{h}x{w}x4", with_alpha(random_image(h, w, 3, seed=index), seed=index)))
    board = (np.indices((301, 403)).sum(axis=0) % 2 * 255).astype(np.uint8)
    corpus.append(("checkerboard301x403x1", board[:, :, None]))
    corpus.append(("checkerboard301x403x3", np.repeat(board[:, :, None], 3, axis=2)))
    return corpus


# Without scikit-image (the GPU machine), the benchmark photo folder serves instead, if it is there.
PHOTO_FOLDER = Path(__file__).resolve().parents[2] / ".device" / "photos"


@functools.lru_cache(maxsize=None)
def _photo_sources() -> Tuple[Named, ...]:
    try:
        import skimage.data as skimage_data
    except ImportError:
        return _folder_photos(PHOTO_FOLDER, count=12)
    colour = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
    grey = ("camera", "moon", "coins", "text", "page")
    photos = [(name, getattr(skimage_data, name)()) for name in colour]
    photos += [(name, getattr(skimage_data, name)()[:, :, None]) for name in grey]
    return tuple((name, np.ascontiguousarray(array, dtype=np.uint8)) for name, array in photos)


def _folder_photos(folder: Path, count: int) -> Tuple[Named, ...]:
    paths = sorted(folder.glob("*.jp*g"))[:count] if folder.is_dir() else []
    if not paths:
        pytest.skip(f"real photos need scikit-image or JPEGs in {folder}")
    photos = []
    for path in paths:
        with Image.open(path) as image:
            array = np.asarray(image.convert("RGB") if image.mode not in ("L", "RGB") else image)
        photos.append((path.stem, array[:, :, None] if array.ndim == 2 else array))
    return tuple(photos)


def _pil_resized(array: np.ndarray, height: int, width: int) -> np.ndarray:
    image = to_pil(array).resize((width, height), Image.LANCZOS)
    resized = np.asarray(image)
    return resized[:, :, None] if resized.ndim == 2 else resized


def photo_corpus(target: Tuple[int, int], share: Tuple[int, int] = (0, 1)) -> List[Named]:
    """Real photos as they are, at web sizes, as thin strips, and cropped to the target size and one
    pixel around it. ``share=(k, m)`` keeps every m-th variant from the k-th: spread over the transform
    cases, the CPU tests see every variant while each case costs 1/m."""
    corpus: List[Named] = []
    th, tw = target
    for index, (name, photo) in enumerate(_photo_sources()):
        corpus.append((name, photo))
        corpus.append((f"{name}-strip", photo[: 3 + index % 4]))
        corpus.append((f"{name}-column", photo[:, : 2 + index % 5]))
        if index % 3 == 0:
            corpus.append((f"{name}-240x320", _pil_resized(photo, 240, 320)))
        if index % 3 == 1:
            corpus.append((f"{name}-768x1024", _pil_resized(photo, 768, 1024)))
        if photo.shape[2] == 3 and index % 2 == 0:
            corpus.append((f"{name}-rgba", with_alpha(photo, seed=index)))
        h, w = photo.shape[:2]
        for dh, dw in ((0, 0), (1, -1), (-1, 1)):
            ch, cw = min(h, th + dh), min(w, tw + dw)
            corpus.append((f"{name}-crop{ch}x{cw}", np.ascontiguousarray(photo[:ch, :cw])))
    k, m = share
    return corpus[k::m]


def to_pil(array: np.ndarray) -> Image.Image:
    """The PIL image a decoder would give for these pixels: mode "L", "RGB" or "RGBA" by channel count."""
    if array.shape[2] == 1:
        return Image.fromarray(np.ascontiguousarray(array[:, :, 0]), mode="L")
    return Image.fromarray(np.ascontiguousarray(array), mode="RGB" if array.shape[2] == 3 else "RGBA")


def reference_or_error(preprocess, array: np.ndarray):
    """OpenCLIP's ``preprocess(pil_image)``, or the exception it raises."""
    try:
        return preprocess(to_pil(array))
    except Exception as error:  # the contract covers failures too: both must refuse the same images
        return error


# Thin and tiny images (h, w) whose pass order is visible: the real-photo columns that once failed on
# the GPU (Pillow 12.2's tall-image rule), both sides of the 100x rule, and their transposes.
THIN_SIZES = ((512, 2), (400, 3), (872, 6), (512, 4), (512, 5), (300, 4), (427, 5), (303, 6), (250, 2), (201, 2),
              (2, 250), (4, 300), (1, 1), (2, 3), (7, 1), (1, 9), (40, 3), (3, 40), (1000, 7))


def resize_in_order(image: Image.Image, size: Tuple[int, int], resample: int, vertical_first: bool) -> Image.Image:
    """Pillow's resize to ``size`` (w, h) with its two passes forced into one order: two one-axis
    resizes, which every Pillow version computes the same way. RGBA goes through RGBa as Pillow does."""
    if image.mode == "RGBA":
        return resize_in_order(image.convert("RGBa"), size, resample, vertical_first).convert("RGBA")
    width, height = size
    middle = (image.width, height) if vertical_first else (width, image.height)
    return image.resize(middle, resample).resize(size, resample)


def reference_in_order(preprocess, array: np.ndarray, vertical_first: bool) -> torch.Tensor:
    """``preprocess(pil)`` with the resize's pass order forced (the other steps as OpenCLIP runs them)."""
    resize, *rest = preprocess.transforms
    image = to_pil(array)
    size = resize(image).size  # the transform's own geometry
    resample = Image.Resampling.BICUBIC if "BICUBIC" in str(resize.interpolation) else Image.Resampling.BILINEAR
    out = resize_in_order(image, size, resample, vertical_first)
    for step in rest:
        out = step(out)
    return out


@pytest.fixture
def single_thread_torch():
    """The corpora are many small images: one intra-op thread is faster than several on a busy host."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class TransformCase(NamedTuple):
    preprocess: object        # OpenCLIP's eval Compose
    target: Tuple[int, int]   # its (h, w)
    index: int                # position in TRANSFORM_CASES (to spread a corpus over the cases)


@pytest.fixture(params=range(len(TRANSFORM_CASES)), ids=[case_id(c) for c in TRANSFORM_CASES])
def transform_case(request) -> TransformCase:
    """One resize mode x interpolation x size, as OpenCLIP builds it."""
    from open_clip.transform import image_transform

    mode, interpolation, size = TRANSFORM_CASES[request.param]
    preprocess = image_transform(size, is_train=False, resize_mode=mode, interpolation=interpolation)
    return TransformCase(preprocess, pair(size), request.param)


@pytest.fixture(scope="session")
def corpora():
    """The corpus builders and reference helpers above, for the test modules of this folder."""
    return types.SimpleNamespace(
        random=random_corpus, photos=photo_corpus, to_pil=to_pil, reference=reference_or_error,
        random_image=random_image, with_alpha=with_alpha, large_sizes=LARGE_SIZES,
        thin_sizes=THIN_SIZES, reference_in_order=reference_in_order,
    )
