"""Fixtures of this folder: the resample tests' corpora (from image_corpus.py), real photo files on disk and
ViT-B-32's eval transform for the ImagePreprocessor tests."""
import pytest
from image_corpus import corpora, single_thread_torch, transform_case  # noqa: F401 (fixtures for every module here)


@pytest.fixture(scope="session")
def photo_files(tmp_path_factory):
    """~80 files: real photos at several sizes, JPEG settings and PNG/WebP/BMP/TIFF modes."""
    from photo_corpus import build_photo_corpus

    return build_photo_corpus(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="session")
def vit_b32_preprocess():
    """ViT-B-32's eval transform (shortest side 224, bicubic, center crop, OpenAI mean/std)."""
    from open_clip.transform import image_transform

    return image_transform(224, is_train=False)
