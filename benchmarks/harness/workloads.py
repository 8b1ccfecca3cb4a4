"""Inputs for the benchmark: token ids and images, all real (never zeros), all reproducible.

- ``random`` text: uniformly random token ids over the whole 77 positions, as the published table
  used. Such rows have no end-of-text token, so OpenCLIP's argmax pooling picks the position of the
  largest id, and every position is real work.
- ``captions`` text: ImageNet class names x OpenAI's 80 prompt templates (shipped by OpenCLIP),
  tokenized with the model's own tokenizer: SOT + a dozen tokens + EOT, zero padded; the realistic
  workload and the one the zero-shot classifier is built from.
- images: standard-normal pixels (already "normalized", like the model's preprocess output) or the
  user's own pictures through Pillow and the model's own preprocess.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import torch

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")

Tokenizer = Callable[[List[str]], torch.Tensor]


class ImageFolderError(ValueError):
    """``--images DIR`` holds no readable image; ``str()`` is the user-facing message."""


def random_token_ids(batch: int, context_length: int, vocab_size: int, seed: int) -> torch.Tensor:
    """``(batch, context_length)`` int64 ids drawn uniformly from ``[1, vocab_size)``.

    Id 0 (the padding id) is left out so that no row is all padding.
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (batch, context_length), generator=generator)


def zero_shot_prompts(
    classnames: Optional[Sequence[str]] = None,
    templates: Optional[Sequence[Callable[[str], str]]] = None,
) -> List[str]:
    """All prompts of a zero-shot classifier, class-major: every template of class 0, then class 1...
    (default: OpenCLIP's ImageNet class names and templates)."""
    # Imported here, not at the top: a benchmark script's decoding workers import it, and need no OpenCLIP.
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    classnames = IMAGENET_CLASSNAMES if classnames is None else classnames
    templates = OPENAI_IMAGENET_TEMPLATES if templates is None else templates
    return [template(name) for name in classnames for template in templates]


def caption_prompts(count: int, seed: int) -> List[str]:
    """``count`` captions sampled (fixed seed, without repeats while possible) from classes x templates."""
    prompts = zero_shot_prompts()
    random.Random(seed).shuffle(prompts)
    return [prompts[index % len(prompts)] for index in range(count)]


def caption_token_ids(tokenizer: Tokenizer, batch: int, seed: int) -> torch.Tensor:
    """``(batch, context_length)`` ids of ImageNet captions, from the model's own tokenizer."""
    return tokenizer(caption_prompts(batch, seed))


def random_images(batch: int, image_size: Sequence[int], seed: int) -> torch.Tensor:
    """``(batch, 3, H, W)`` standard-normal pixels: the scale of preprocessed (normalized) images."""
    generator = torch.Generator().manual_seed(seed)
    height, width = image_size
    return torch.randn((batch, 3, height, width), generator=generator)


def image_files(directory: Path) -> List[Path]:
    """Image files directly inside ``directory`` (sorted, by suffix)."""
    return sorted(
        path for path in Path(directory).iterdir()
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
    )


def check_image_folder(directory: Path) -> List[Path]:
    """The image files of ``directory``; :class:`ImageFolderError` if it is missing or has none.

    Called before any model is loaded, so a typo fails at once rather than after minutes of work.
    """
    if not Path(directory).is_dir():
        raise ImageFolderError(f"error: --images {directory}: not a directory")
    paths = image_files(directory)
    if not paths:
        raise ImageFolderError(f"error: --images {directory}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return paths


def load_image_folder(directory: Path, preprocess: Callable, limit: int) -> Tuple[torch.Tensor, List[str]]:
    """Up to ``limit`` readable images from ``directory`` as ``preprocess(Image.open(p))`` computes them
    (through ``clip_flash.ImagePreprocessor`` on the CPU, which is exactly that), stacked; and the
    unreadable files skipped on the way, with the reason.

    Raises :class:`ImageFolderError` when the folder is missing or holds no readable image.
    """
    import clip_flash

    paths = check_image_folder(directory)
    rows: List[torch.Tensor] = []
    skipped: List[str] = []
    with clip_flash.ImagePreprocessor(preprocess, device="cpu", dtype=torch.float32) as prep:
        for start in range(0, len(paths), limit):
            chunk = paths[start:start + limit]
            prepared = prep(chunk)
            skipped += [f"{chunk[index]}: {reason}" for index, reason in prepared.failures]
            rows += list(prepared.pixels[: limit - len(rows)])
            if len(rows) >= limit:
                break
    if not rows:
        raise ImageFolderError(f"error: --images {directory}: no readable image ({'; '.join(skipped[:3])})")
    return torch.stack(rows), skipped


def take_rows(pool: torch.Tensor, batch: int) -> torch.Tensor:
    """``batch`` rows of ``pool``, cycling through it when it has fewer rows than asked."""
    indices = torch.arange(batch) % pool.shape[0]
    return pool[indices]
