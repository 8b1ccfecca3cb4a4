"""The baseline the job's speed is compared with: the same job the way OpenCLIP's users run it.

OpenCLIP's PIL ``preprocess(Image.open(p))`` and its tokenizer in ``DataLoader`` worker processes (as
clip-retrieval does), the model unpatched, embeddings copied back batch by batch. It writes the same
shards through the same writer, so its output is a valid job output too (of the ``stock`` settings).

Batches never span shards. Each worker takes every ``num_workers``-th batch of the whole plan, and a
DataLoader hands worker batches back round-robin, so they arrive in plan order.
"""
from __future__ import annotations

import io
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .pipeline import finish_features
from .run_stats import PipelineStats
from ..environment import usable_cores
from .items import Item, Shard, Source
from .writer import ShardResult


def _stock_image(preprocess: Callable, item: Item) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(item.image) if isinstance(item.image, bytes) else item.image)
        return preprocess(image), None
    except Exception as error:  # noqa: BLE001 - clip-retrieval skips a bad file the same way
        return None, f"{type(error).__name__}: {error}"


class _Batches(torch.utils.data.IterableDataset):
    """Yields prepared batches: (shard position, is last of shard, items kept, pixels, tokens, failures)."""

    def __init__(self, shards: List[Shard], preprocess: Optional[Callable], tokenizer: Optional[Callable],
                 batch_size: int) -> None:
        self.shards, self.preprocess, self.tokenizer, self.batch_size = shards, preprocess, tokenizer, batch_size

    def _plan(self) -> Iterator[Tuple[int, bool, List[Item]]]:
        for position, shard in enumerate(self.shards):
            items = list(shard.load())
            starts = list(range(0, len(items), self.batch_size)) or [0]
            for start in starts:
                yield position, start == starts[-1], items[start:start + self.batch_size]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, me = (info.num_workers, info.id) if info else (1, 0)
        for number, (position, last, items) in enumerate(self._plan()):
            if number % workers != me:
                continue
            failures = [(item.path, item.error) for item in items if item.error]
            items = [item for item in items if not item.error]
            pixels = None
            if self.preprocess is not None:
                prepared = [_stock_image(self.preprocess, item) for item in items]
                failures += [(item.path, reason) for item, (_, reason) in zip(items, prepared) if reason]
                kept = [(item, tensor) for item, (tensor, _) in zip(items, prepared) if tensor is not None]
                items = [item for item, _ in kept]
                pixels = torch.stack([tensor for _, tensor in kept]) if kept else None
            tokens = self.tokenizer([item.caption for item in items]) if self.tokenizer and items else None
            yield position, last, items, pixels, tokens, failures


class StockPipeline:
    """``run(shards, commit, progress)`` like :class:`~clip_flash.jobs.pipeline.EmbeddingPipeline`."""

    def __init__(self, loaded: Any, device: torch.device, source: Source, batch_size: int, normalize: bool,
                 out_dtype: np.dtype, workers: Optional[int] = None) -> None:
        import open_clip

        self.model, self.device = loaded.model, device
        self.preprocess = loaded.preprocess if source.has_images else None
        self.tokenizer = open_clip.get_tokenizer(loaded.spec.name) if source.has_captions else None
        self.wds_key_column = source.kind == "webdataset"
        self.batch_size, self.normalize, self.out_dtype = batch_size, normalize, np.dtype(out_dtype)
        self.dtype = loaded.dtype
        self.workers = max(usable_cores() - 1, 1) if workers is None else workers

    def _finish(self, features: torch.Tensor) -> np.ndarray:
        return finish_features(features, self.normalize, self.out_dtype).cpu().numpy()

    def close(self) -> None:
        """Nothing to stop: the DataLoader's workers end with each run."""

    def run(self, shards: Iterable[Shard], commit: Callable[[ShardResult], None],
            progress: Any = None) -> PipelineStats:
        shards = list(shards)
        stats = PipelineStats()
        started = time.perf_counter()
        if not shards:
            return stats
        loader = torch.utils.data.DataLoader(
            _Batches(shards, self.preprocess, self.tokenizer, self.batch_size), batch_size=None,
            num_workers=self.workers, pin_memory=self.device.type == "cuda",
            prefetch_factor=2 if self.workers else None)
        parts: Dict[str, List[Any]] = {"image": [], "text": [], "failures": []}
        metadata: Dict[str, List[Any]] = {}
        with torch.inference_mode():
            for position, last, items, pixels, tokens, failures in loader:
                parts["failures"] += failures
                if items:
                    if pixels is not None:
                        features = self.model.encode_image(pixels.to(self.device, self.dtype, non_blocking=True))
                        parts["image"].append(self._finish(features))
                        metadata.setdefault("image_path", []).extend(item.path for item in items)
                    if tokens is not None:
                        parts["text"].append(self._finish(self.model.encode_text(tokens.to(self.device))))
                        metadata.setdefault("caption", []).extend(item.caption for item in items)
                        if pixels is None:  # a text-only job: each row's id in its input file
                            metadata.setdefault("id", []).extend(item.path for item in items)
                    if self.wds_key_column:
                        metadata.setdefault("key", []).extend(item.key for item in items)
                if progress is not None:
                    progress.update(len(items) + len(failures))
                if last:
                    shard = shards[position]
                    result = ShardResult(
                        index=shard.index, fingerprint=shard.fingerprint,
                        image_embeddings=np.concatenate(parts["image"]) if parts["image"] else None,
                        text_embeddings=np.concatenate(parts["text"]) if parts["text"] else None,
                        metadata=metadata, failures=parts["failures"], inputs=shard.inputs)
                    commit(result)
                    stats.rows += result.rows
                    stats.failures += len(result.failures)
                    stats.shards += 1
                    stats.marks.append((stats.rows + stats.failures, time.perf_counter() - started))
                    parts = {"image": [], "text": [], "failures": []}
                    metadata = {}
        stats.seconds = time.perf_counter() - started
        return stats
