"""TEMPORARY stand-ins for clip_flash.inputs (ImagePreprocessor, get_tokenizer) until those branches land.

Same call shapes, OpenCLIP's own PIL preprocess and tokenizer underneath; deleted when the real ones merge.
"""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch


@dataclass
class DecodedImages:
    tensors: List[Optional[torch.Tensor]]
    failures: List[Tuple[int, str]]


@dataclass
class PreparedImages:
    pixels: torch.Tensor
    indices: List[int]
    failures: List[Tuple[int, str]]


class ImagePreprocessor:
    def __init__(self, preprocess, device, dtype, decode: str = "cpu", workers: Optional[int] = None) -> None:
        self.preprocess, self.device, self.dtype = preprocess, torch.device(device), dtype
        self.pool = ThreadPoolExecutor(workers or 2)

    def _one(self, item: Any):
        from PIL import Image

        try:
            image = Image.open(io.BytesIO(item) if isinstance(item, bytes) else item)
            return self.preprocess(image), None
        except Exception as error:  # noqa: BLE001 - a bad file is reported, never fatal
            return None, f"{type(error).__name__}: {error}"

    def decode(self, items: Sequence[Any]) -> DecodedImages:
        results = list(self.pool.map(self._one, items))
        return DecodedImages([tensor for tensor, _ in results],
                             [(index, reason) for index, (_, reason) in enumerate(results) if reason])

    def prepare(self, decoded: DecodedImages) -> PreparedImages:
        indices = [index for index, tensor in enumerate(decoded.tensors) if tensor is not None]
        if not indices:
            return PreparedImages(torch.empty(0, 3, 1, 1, device=self.device, dtype=self.dtype), [], decoded.failures)
        pixels = torch.stack([decoded.tensors[index] for index in indices]).to(self.device, self.dtype)
        return PreparedImages(pixels, indices, decoded.failures)

    def __call__(self, items: Sequence[Any]) -> PreparedImages:
        return self.prepare(self.decode(items))


def get_tokenizer(model_name: str):
    import open_clip

    return open_clip.get_tokenizer(model_name)
