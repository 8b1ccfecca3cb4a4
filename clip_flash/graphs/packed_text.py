"""CUDA graphs of a patched text tower over packed real tokens: no padding computed, no kernel launched per layer.

    graphs = PackedTextGraphs(model, max_rows=1024)   # model patched by clip_flash.patch, on a CUDA device
    graphs.capture_all()                               # one graph per token-count bucket
    features = graphs.encode_text(tokens)              # host token ids (n, context) -> model.encode_text(tokens)

A batch of captions of mixed lengths, padded to its longest (or cut into length groups, each padded to a bucket:
``GraphedEncoder``), computes many padding tokens; the patched tower's eager ``encode_text`` packs only the real
tokens, with variable-length causal attention, but launches a few hundred kernels from Python a call (about 4 ms
of host time for ViT-L-14, which an embedding server's other threads need). Here each graph computes a fixed
number of packed tokens, ``T``: the tokens of up to ``max_rows`` captions one after another, then padding tokens
(id 0) as sequences of their own of at most ``context_length`` tokens, so every row of every kernel is a real,
finite computation; sequence slots past the last are empty (zero length). The graphs' one input is a vector of
int64 laid out as ``PackedLayout`` says, built on the host in numpy (``pack_token_rows``) and copied in once a
replay. A batch runs the smallest bucket holding its real tokens, or once the graphs are timed
(``time_replays``) the cheapest holding them. The same computation as stock's, to the
kernels' rounding (causal attention never looks past a row's pooled token, every other op is per token); fp16
and bf16 only, the dtypes of the variable-length attention kernels.

The graphs capture the model as it is when captured; capture again after changing its weights (the server never
does). Replays are serialized on the graphs' own stream as in ``GraphedEncoder`` (``capture.CaptureSpace``).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..ops.cuda_timing import median_cuda_ms
from ..patching.text_fast_path import encode_packed_tokens, pooled_positions, text_tower_plan
from .capture import CapturedGraph, CaptureSpace, GraphKey

logger = logging.getLogger(__name__)

SMALLEST_TOKEN_BUCKET = 256
# Token-count buckets per doubling: padding to the next bucket is pure GEMM work (the GEMMs are most of a packed
# batch), so finer buckets pay. 8 rather than 4 padded a 1,024-caption batch of web captions (about 25,700 tokens)
# to 26,624 rather than 28,672 and gave 1.07-1.09x the captions/s at 342 and 1,024 a batch on an H100
# (benchmarks/results/h100/text_buckets_04bca1b); 16 halved the padding again. 32 (a batch pads by at most 1/32):
# on an H200, ViT-L-14 packed caption batches at 101,356 / 102,035 captions/s against 96,836 / 101,351 with 16 at
# 1,024 a batch, and 63,928 / 64,555 against 62,142 / 62,376 at 64 (benchmarks/results/h200/
# flat_activation_7e75d48). The price is start-up: for ViT-L-14 at 1,024 captions 264 graphs from the same 1,862
# MiB pool, captured and timed in about 11 s against 5 for 133.
PACKED_BUCKETS_PER_DOUBLING = 32


@dataclass(frozen=True)
class PackedLayout:
    """Where each part of a packed graph's input vector lies: token ids (``tokens``), their positions
    (``tokens``), sequence starts (``slots + 1``, int32 once on the device), each row's pooled token (``rows``)."""

    tokens: int  # T: packed tokens the graph computes
    rows: int  # captions a replay takes at most
    context_length: int

    @property
    def slots(self) -> int:
        """Sequences at most: every caption, and the padding in sequences of at most ``context_length``."""
        return self.rows + math.ceil(self.tokens / self.context_length)

    @property
    def size(self) -> int:
        return 2 * self.tokens + self.slots + 1 + self.rows


def pack_token_rows(tokens: np.ndarray, lengths: np.ndarray, layout: PackedLayout) -> np.ndarray:
    """The packed input vector of token rows ``tokens`` (n, context) whose first ``lengths`` tokens are real."""
    n, width = tokens.shape
    total = int(lengths.sum())
    if n > layout.rows or total > layout.tokens:
        raise ValueError(f"{n} rows of {total} tokens do not fit a graph of {layout.rows} rows, {layout.tokens} tokens")
    t, slots = layout.tokens, layout.slots
    out = np.zeros(layout.size, dtype=np.int64)
    real = np.arange(width) < lengths[:, None]
    out[:total] = tokens[real]  # row-major: each row's real tokens, one row after another
    out[t:t + total] = np.nonzero(real)[1]
    padding = t - total
    out[t + total:2 * t] = np.arange(padding) % layout.context_length
    starts = out[2 * t:2 * t + slots + 1]
    np.cumsum(lengths, out=starts[1:n + 1])
    chunks = math.ceil(padding / layout.context_length)
    starts[n + 1:n + 1 + chunks] = np.minimum(total + layout.context_length * np.arange(1, chunks + 1), t)
    starts[n + 1 + chunks:] = t  # empty slots
    out[2 * t + slots + 1:2 * t + slots + 1 + n] = starts[1:n + 1] - 1
    return out


def cheapest_bucket(buckets: Sequence[int], total: int, replay_ms: Optional[Dict[int, float]] = None) -> Optional[int]:
    """The bucket a batch of ``total`` real tokens replays: of the buckets holding it, the one measured cheapest
    (``replay_ms``; a larger graph can replay faster than a smaller one, its kernels tiling its shapes better), the
    smallest of equals, or without times the smallest. None: no bucket holds it."""
    holding = [bucket for bucket in sorted(buckets) if bucket >= total]
    if not holding:
        return None
    if not replay_ms:
        return holding[0]
    return min(holding, key=lambda bucket: (replay_ms.get(bucket, float("inf")), bucket))


def token_buckets(max_tokens: int, per_doubling: int = PACKED_BUCKETS_PER_DOUBLING,
                  smallest: int = SMALLEST_TOKEN_BUCKET) -> List[int]:
    """Token counts with a graph: ``smallest``, then ``per_doubling`` evenly spaced counts per doubling, up to and
    including ``max_tokens`` (a batch pads to a count at most ``1 / per_doubling`` larger)."""
    sizes, low = [smallest], smallest
    while low < max_tokens:
        step = max(1, low // per_doubling)
        sizes += [size for size in range(low + step, 2 * low + 1, step) if size < max_tokens]
        low *= 2
    return sorted(set(size for size in sizes if size < max_tokens)) + [max_tokens]


class PackedTextGraphs:
    """One CUDA graph of ``model``'s text tower per token-count bucket, over packed real tokens.

    Args:
        model: an OpenCLIP CLIP (or CustomTextCLIP) patched by ``clip_flash.patch`` so its text tower skips padding
            with packed attention on this device and dtype, on a CUDA device, in eval mode.
        max_rows: captions a call takes at most (a server's ``--max-text-batch``).
        buckets: token counts with a graph (default ``token_buckets(max_rows * context_length)``).
    """

    def __init__(self, model: nn.Module, max_rows: int, buckets: Optional[Sequence[int]] = None) -> None:
        tower, plan = text_tower_plan(model)
        if tower is None:
            raise ValueError("the text tower does not skip padding: patch the model with clip_flash.patch first")
        device = tower.token_embedding.weight.device
        dtype = tower.transformer.get_cast_dtype()
        if device.type != "cuda":
            raise ValueError(f"packed text graphs need a CUDA device, the model is on {device}")
        if not plan.packs(device.type, dtype):
            raise ValueError(f"the text tower's attention backend has no packed (variable-length) kernel for {dtype} "
                             f"on {device.type}")
        self.tower, self.plan, self.device = tower, plan, device
        self.context_length = tower.positional_embedding.shape[0]
        self.max_rows = max_rows
        self.buckets = sorted(buckets) if buckets is not None else token_buckets(max_rows * self.context_length)
        self.graphs: Dict[int, CapturedGraph] = {}
        self.layouts = {t: PackedLayout(t, max_rows, self.context_length) for t in self.buckets}
        self.space = CaptureSpace(device, torch.cuda.Stream(device))
        self.replay_ms: Dict[int, float] = {}  # by bucket, once timed: batches then replay the cheapest holding them
        self._lock = threading.Lock()

    def capture_all(self) -> None:
        """Capture every bucket, largest first (the memory pool is sized once). A failed capture raises."""
        started = time.perf_counter()
        with torch.inference_mode():
            for t in reversed(self.buckets):
                if t in self.graphs:
                    continue
                layout = self.layouts[t]
                key = GraphKey("text", 1, (layout.size,), torch.long, t)
                # Only padding sequences at first: a valid packing for the warm-up's attention kernels.
                empty = pack_token_rows(np.zeros((0, self.context_length), dtype=np.int64), np.zeros(0, np.int64),
                                        layout)
                captured = self.space.capture(key, lambda x, layout=layout: self._forward(x[0], layout),
                                              warmup_iters=1, first_input=torch.from_numpy(empty)[None])
                if isinstance(captured, str):
                    raise RuntimeError(captured)
                self.graphs[t] = captured
        logger.info("captured %d packed text graphs (%d to %d tokens) in %.1f s", len(self.graphs), self.buckets[0],
                    self.buckets[-1], time.perf_counter() - started)

    def _forward(self, packed: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
        t, slots = layout.tokens, layout.slots
        starts = packed[2 * t:2 * t + slots + 1].to(torch.int32)
        last = packed[2 * t + slots + 1:]
        return encode_packed_tokens(self.tower, packed[:t], packed[t:2 * t], starts, last, self.context_length)

    def lengths(self, tokens: torch.Tensor) -> np.ndarray:
        """Real tokens of each row (to its pooled token, found as the tower pools)."""
        return (pooled_positions(tokens, self.plan.pool_type, self.plan.eos_id) + 1).numpy()

    def bucket_for(self, total: int) -> Optional[int]:
        """The token count of the graph a batch of ``total`` real tokens replays (``cheapest_bucket``; None: more
        than the largest)."""
        return cheapest_bucket(self.buckets, total, self.replay_ms)

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """``model.encode_text(tokens, normalize)`` for host token ids ``tokens`` (n, context_length), n at most
        ``max_rows``, from the smallest captured graph holding their real tokens."""
        if tokens.device.type != "cpu" or tokens.dim() != 2 or tokens.shape[1] != self.context_length:
            raise ValueError(f"packed text graphs take host token ids of shape (n, {self.context_length}), got "
                             f"{tuple(tokens.shape)} on {tokens.device}")
        if not 0 < tokens.shape[0] <= self.max_rows:
            raise ValueError(f"packed text graphs take 1 to {self.max_rows} rows, got {tokens.shape[0]}")
        lengths = self.lengths(tokens)
        total = int(lengths.sum())
        bucket = self.bucket_for(total)
        if bucket not in self.graphs:
            raise ValueError(f"no packed text graph holds {total} tokens (captured: {sorted(self.graphs)})")
        packed = torch.from_numpy(pack_token_rows(tokens.numpy(), lengths, self.layouts[bucket]))[None]
        with torch.inference_mode(), self._lock:
            return self.space.replay(self.graphs[bucket], packed, 1, normalize, out_rows=tokens.shape[0])

    def time_replays(self, repeats: int = 3) -> Dict[int, float]:
        """Device milliseconds of one replay of each graph, by its token count: the median of ``repeats`` after a
        warm one, each alone (CUDA events around it, the device idle before), copies in and out included, on
        captions of 5 to 49 tokens (mean 27) filling the bucket as far as ``max_rows`` allows."""
        times: Dict[int, float] = {}
        lengths_cycle = 5 + (np.arange(self.max_rows) * 13) % 45
        for t in self.buckets:
            lengths = lengths_cycle[:max(1, min(self.max_rows, t // 27))].copy()
            lengths = lengths[np.cumsum(lengths) <= t] if lengths.sum() > t else lengths
            lengths = np.minimum(lengths, self.context_length)
            tokens = np.ones((len(lengths), self.context_length), dtype=np.int64)
            packed = torch.from_numpy(pack_token_rows(tokens, lengths, self.layouts[t]))[None]
            with torch.inference_mode(), self._lock:
                times[t] = median_cuda_ms(
                    lambda: self.space.replay(self.graphs[t], packed, 1, False, out_rows=len(lengths)), repeats,
                    each_alone=True, device=self.device)
        self.replay_ms = dict(times)
        return times
