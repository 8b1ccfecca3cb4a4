"""Fixtures of the image-input tests: the re-encoded photo corpus and OpenCLIP's eval transform."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List

import open_clip
import pytest

from image_corpus import build_photo_corpus


@pytest.fixture(scope="session")
def photo_corpus(tmp_path_factory) -> List[Path]:
    """~80 files: real photos at several sizes, JPEG settings and PNG/WebP/BMP/TIFF modes."""
    return build_photo_corpus(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="session")
def vit_b32_preprocess() -> Callable:
    """ViT-B-32's eval transform (shortest side 224, bicubic, center crop, OpenAI mean/std)."""
    return open_clip.image_transform(224, is_train=False)
