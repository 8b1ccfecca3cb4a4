"""The single-device embedding pipeline: files in, one finished shard at a time out.

Four stages, each in its own thread, joined by bounded queues so memory stays bounded:

    reader thread   walks the shards, cuts them into batches, hands each batch to the decoders
    decoder threads the CPU half of image preparation (``ImagePreprocessor.decode``: file reads and
                    JPEG decoding in threads that release the GIL) and tokenization
                    (these two are the run's :class:`~.batch_feed.BatchFeed`, which may start before the run)
    main thread     the device half (``ImagePreprocessor.prepare``: copy + resize kernel) on a side
                    CUDA stream, both encoders on the compute stream, normalisation, and an
                    asynchronous copy of the embeddings into pinned host memory
    writer thread   assembles nothing itself: it commits each finished shard (``OutputFolder.write``; its
                    thread is :class:`~.commit_thread.CommitThread`)

The main thread launches batch i and only then waits for batch i-2's embeddings (a CUDA event), so
the GPU always has queued work while Python prepares the next launch: with decoded batches queued,
the GPU never waits on Python, not even at a shard boundary (the next shard's batches launch while
the last ones of the previous shard are still in flight). Batches never span shards, so a shard is
handed to the writer as soon as its last batch lands.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..backends import choosing_for_replay
from .batch_feed import DONE, FLUSH, Batch, BatchFeed, ShardEnd, ShardStart, decode_batch
from .batches import ItemBatch, LazyColumn, RowIds
from .commit_thread import CommitThread
from .run_stats import PipelineStats, pinned_allocator_counters
from .sources import Shard
from .warm_up import GRAPH_PROBE_BATCH, eager_batch_deciding_graphs, start_decoder, warm_up_device
from .writer import ShardResult

logger = logging.getLogger(__name__)

@dataclass
class _Accumulator:
    """A shard's rows as they arrive, in input order."""

    shard: Shard
    image: List[np.ndarray] = field(default_factory=list)
    text: List[np.ndarray] = field(default_factory=list)
    metadata: Dict[str, List[Any]] = field(default_factory=dict)
    failures: List[Tuple[str, str]] = field(default_factory=list)
    outstanding: int = 0                        # batches launched and not collected yet


@dataclass
class _Launched:
    """A batch whose embeddings are on their way to pinned host memory."""

    items: ItemBatch                  # the inputs that became rows
    host_image: Optional[torch.Tensor]
    host_text: Optional[torch.Tensor]
    ready: Optional["torch.cuda.Event"]
    failures: List[Tuple[str, str]]
    shard: Optional[_Accumulator] = None


# Threads preparing batches ahead of the GPU (each hands one batch's inputs to the decoder, then waits; with
# decode="gpu" each also runs its batch's hardware JPEG decode). Two keep the GPU fed: one batch is decoded
# while the other is handed over; more only hold more batches in memory.
DEFAULT_DECODE_THREADS = 2
# Decoded batches queued for the device. Each holds a page-locked block (~230 MB for 256 web photos) until its
# upload: the decoders only need to stay a batch or two ahead (at most 2 decode at once).
DEFAULT_PREFETCH_BATCHES = 3


def input_blocks_alive(prefetch_batches: int = DEFAULT_PREFETCH_BATCHES, batches_in_flight: int = 2) -> int:
    """Batches whose decoded inputs (each in its own page-locked block) can be alive at once in a run: those
    queued for the device, the one the reader holds while the queue is full, the one the main thread launches,
    and up to ``batches_in_flight`` freed blocks whose uploads torch's allocator waits for before it hands them
    out again."""
    return prefetch_batches + 1 + 1 + batches_in_flight


def finish_features(features: torch.Tensor, normalize: bool, out_dtype: np.dtype) -> torch.Tensor:
    """What is written: L2-normalised in fp32 (when asked), then cast to the output dtype."""
    features = features.float()
    if normalize:
        features = F.normalize(features, dim=-1)
    return features.to(getattr(torch, np.dtype(out_dtype).name))


class EmbeddingPipeline:
    """Embed shards of items with one model on one device; see the module docstring for the stages.

    ``image_preparer`` has ``decode(items)`` (CPU, thread-safe) and ``prepare(decoded)`` returning
    ``pixels``, ``indices`` and ``failures`` (clip_flash's ImagePreprocessor); ``tokenizer`` is called on
    a list of strings and returns a LongTensor of token ids. Either may be None when the job has no
    images / no captions. On CUDA, ``cuda_graphs`` replays full image batches from a captured CUDA graph
    (``clip_flash.GraphedEncoder``, captured by :meth:`warm_up`, else at the first full batch); False runs
    every batch eager.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, image_preparer: Any = None,
                 tokenizer: Optional[Callable] = None, batch_size: int = 256, normalize: bool = True,
                 out_dtype: np.dtype = np.float16, decode_threads: int = DEFAULT_DECODE_THREADS,
                 prefetch_batches: int = DEFAULT_PREFETCH_BATCHES, batches_in_flight: int = 2,
                 wds_key_column: bool = False, cuda_graphs: bool = True) -> None:
        self.model = model
        self.device = torch.device(device)
        self.image_preparer = image_preparer
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.normalize = normalize
        self.out_dtype = np.dtype(out_dtype)
        self.decode_threads = decode_threads
        self.prefetch_batches = prefetch_batches
        self.cuda = self.device.type == "cuda"
        # On a CPU a batch's embeddings exist when its launch returns: collected at once, so the progress bar
        # and the shard hand-over follow every batch (else a job of a few batches shows no progress until its end).
        self.batches_in_flight = max(1, batches_in_flight) if self.cuda else 0
        self.wds_key_column = wds_key_column
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        # A patched text tower takes the pinned host ids itself and reads their lengths there: no device sync
        # per batch, so the next batch queues while the device still encodes this one.
        from ..patching.text_fast_path import takes_host_token_ids  # here: decoding workers import this module

        self.host_tokens = self.cuda and tokenizer is not None and takes_host_token_ids(model)
        # Full image batches replay one CUDA graph (the same work and, as every batch chooses its attention
        # kernels as a replay does (_encode_image), the same rows). An eager ViT forward is hundreds of launches,
        # each releasing the GIL to the decoding threads and waiting to take it back, which can bound the whole
        # job; a replay is one launch.
        self.image_graphs = None
        if self.cuda and cuda_graphs and image_preparer is not None:
            from ..graphs import GraphedEncoder

            # One eager pass before the capture: enough for this stream's cuBLAS workspace and the kernels'
            # first loads; each further pass of a large model costs a batch of device time.
            self.image_graphs = GraphedEncoder(model, batch_sizes=(batch_size,), max_graphs=1, warmup_iters=1)
        # Kept or dropped on the run's own full batches (warm_up.eager_batch_deciding_graphs); until then eager.
        self.image_graphs_decided = False
        self._full_image_batches = 0
        self._items_left: Optional[int] = None  # the run's inputs not yet launched, where its shards' sizes are known
        self._device_warm = not self.cuda
        # Warm-up steps whose first uses were made while the model loaded (jobs.device_ahead): not made again.
        self.made_beside_load: FrozenSet[str] = frozenset()

    def start(self) -> None:
        """Start the image preparer's decoder in the background: call it as early as the preparer exists, so
        that this overlaps whatever comes before :meth:`run`."""
        start = getattr(self.image_preparer, "start", None)
        if start is not None:
            start(batch_size=self.batch_size)

    def warm_up(self, device: bool = True) -> float:
        """Pay before :meth:`run` what the first batch would pay once (see :mod:`clip_flash.jobs.warm_up`); returns
        the seconds spent. ``device=False``: only the decoder's start; the device half (the first calls of the
        decode, resize and encoder kernels) then runs at the start of :meth:`run`, while the run's threads read
        and decode its first batches."""
        seconds = start_decoder(self)
        if device and not self._device_warm:
            seconds += warm_up_device(self, self.decode_threads)
            self._device_warm = True
        return seconds

    # ----- device stage (main thread) -------------------------------------------------------------
    def _finish(self, features: torch.Tensor) -> torch.Tensor:
        return finish_features(features, self.normalize, self.out_dtype)

    def _to_host(self, features: torch.Tensor) -> torch.Tensor:
        if not self.cuda:
            return features
        host = torch.empty(features.shape, dtype=features.dtype, pin_memory=True)
        host.copy_(features, non_blocking=True)
        return host

    def decode(self, items: ItemBatch) -> Tuple[Any, Optional[torch.Tensor]]:
        """A batch's CPU half (thread-safe): what a :class:`~.batch_feed.BatchFeed` of this pipeline decodes."""
        return decode_batch(self.image_preparer, self.tokenizer, self.cuda, items)

    def feed(self, shards: Iterable[Optional[Shard]]) -> BatchFeed:
        """A feed of ``shards`` for :meth:`run`, not started: start it before the run to have its first batches
        decoded before the run begins."""
        return BatchFeed(shards, self.batch_size, self.decode, self.decode_threads, self.prefetch_batches)

    def _launch(self, batch: Batch) -> _Launched:
        if self._items_left is not None:
            self._items_left -= len(batch.items)
        decoded, tokens = batch.decoded.result()
        items, failures = batch.items, []
        pixels = None
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        with torch.inference_mode():
            if self.cuda:
                with torch.cuda.stream(self.copy_stream):
                    pixels, keep, failures = self._prepare(decoded, items)
                    if tokens is not None:
                        tokens = self._select(tokens, keep, len(items))
                        if tokens is not None and not self.host_tokens:
                            tokens = tokens.to(self.device, non_blocking=True)
                compute.wait_stream(self.copy_stream)
                for tensor in (pixels, tokens):
                    if tensor is not None and tensor.is_cuda:
                        tensor.record_stream(compute)
            else:
                pixels, keep, failures = self._prepare(decoded, items)
                if tokens is not None:
                    tokens = self._select(tokens, keep, len(items))
            kept = items.select(keep)
            if not kept:
                return _Launched(kept, None, None, None, failures)
            host_image = self._to_host(self._finish(self._encode_image(pixels))) if pixels is not None else None
            host_text = self._to_host(self._finish(self.model.encode_text(tokens))) if tokens is not None else None
        ready = None
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record(compute)
        return _Launched(kept, host_image, host_text, ready, failures)

    def _encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """``model.encode_image``, from the graph when the batch is full and the graph is kept (partial batches
        run eager: padding them into the graph could change their rows' last bits, as a GEMM's kernel depends
        on its row count). The full batches before the choice run eager, the probe among them timed.

        Every batch, eager or replayed, chooses its attention kernels as a capture does (``choosing_for_replay``;
        CPU calls ignore it): a graph's rows are then the eager rows bit for bit, so a run's rows do not depend on
        whether its graph was kept (a choice made on timings), nor on ``cuda_graphs``; two runs over the same
        inputs (one device, or Ray actors) write the same rows. The warm-ups choose the same way."""
        with choosing_for_replay():
            if self.image_graphs is not None and pixels.shape[0] == self.batch_size:
                if self.image_graphs_decided:
                    return self.image_graphs.encode_image(pixels)
                self._full_image_batches += 1
                if self._full_image_batches >= GRAPH_PROBE_BATCH:
                    left = None if self._items_left is None else self._items_left // self.batch_size
                    return eager_batch_deciding_graphs(self, pixels, left)
            return self.model.encode_image(pixels)

    @property
    def image_graphs_replayed(self) -> bool:
        """Whether full image batches replay a CUDA graph (chosen in the run; False before the choice)."""
        return self.image_graphs_decided and self.image_graphs is not None

    @staticmethod
    def _select(tokens: torch.Tensor, keep: List[int], count: int) -> Optional[torch.Tensor]:
        """The token rows of the items whose image was prepared (all of them, usually: no copy then)."""
        if not keep:
            return None
        return tokens if len(keep) == count else tokens[keep]

    def _prepare(self, decoded: Any, items: ItemBatch):
        """Pixels on the device, the kept item indices, and (path, reason) of those that failed."""
        if decoded is None:
            return None, list(range(len(items))), []
        prepared = self.image_preparer.prepare(decoded)
        indices = prepared.indices
        keep = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        failures = [(items.paths[index], str(reason)) for index, reason in prepared.failures]
        pixels = prepared.pixels if keep else None
        return pixels, keep, failures

    def _collect(self, launched: _Launched, progress: Any) -> None:
        if launched.ready is not None:
            launched.ready.synchronize()
        shard = launched.shard
        shard.outstanding -= 1
        shard.failures.extend(launched.failures)
        if launched.items:
            if launched.host_image is not None:
                shard.image.append(launched.host_image.numpy().copy() if self.cuda else launched.host_image.numpy())
            if launched.host_text is not None:
                shard.text.append(launched.host_text.numpy().copy() if self.cuda else launched.host_text.numpy())
            columns = self._metadata_columns(launched.items)
            for name, values in columns.items():
                default = LazyColumn() if isinstance(values, RowIds) else []
                shard.metadata.setdefault(name, default).extend(values)
        if progress is not None:
            progress.update(len(launched.items) + len(launched.failures))

    def _metadata_columns(self, items: ItemBatch) -> Dict[str, Sequence[Any]]:
        columns: Dict[str, Sequence[Any]] = {}
        if self.image_preparer is not None:
            columns["image_path"] = items.paths
        if self.tokenizer is not None:
            columns["caption"] = items.captions
            if self.image_preparer is None:  # a text-only job: each row's id in its input file
                columns["id"] = items.paths
        if self.wds_key_column:
            columns["key"] = items.keys
        return columns

    def _result(self, shard: _Accumulator) -> ShardResult:
        def stack(parts: List[np.ndarray], present: bool) -> Optional[np.ndarray]:
            if not present:
                return None
            return np.concatenate(parts) if parts else None

        return ShardResult(index=shard.shard.index, fingerprint=shard.shard.fingerprint,
                           image_embeddings=stack(shard.image, self.image_preparer is not None),
                           text_embeddings=stack(shard.text, self.tokenizer is not None),
                           metadata=shard.metadata, failures=shard.failures, inputs=shard.shard.inputs)

    def close(self) -> None:
        """Stop the image preparer's decoding workers; free the image graph's memory."""
        if self.image_graphs is not None:
            self.image_graphs.release()
        close = getattr(self.image_preparer, "close", None)
        if close is not None:
            close()

    # ----- the whole run --------------------------------------------------------------------------
    def run(self, shards: Iterable[Shard], commit: Callable[[ShardResult], None],
            progress: Any = None, more_runs_follow: bool = False, feed: Optional[BatchFeed] = None) -> PipelineStats:
        """Embed every shard and ``commit`` each finished one (from a writer thread, in shard order).
        ``shards`` may be a stream fed while the run goes on (a Ray actor's, :class:`~.shard_stream.ShardStream`):
        a None between shards says nothing more is there for now, so the batches in flight are finished and
        their shard handed over instead of waiting for the next shard's batches to push them out.
        ``more_runs_follow``: this pipeline will run more shards after these (a Ray actor's), so this run's size
        does not bound how many batches an image graph would serve. ``feed``: a feed of these ``shards`` decoding
        with this pipeline's :meth:`decode`, started earlier (:meth:`feed`; a job starts one while its model loads);
        the run closes it."""
        stats = PipelineStats()
        sizes = [shard.size for shard in shards] if isinstance(shards, (list, tuple)) else [None]
        known = not more_runs_follow and all(size is not None for size in sizes)
        self._items_left = sum(sizes) if known else None
        pinned_before = pinned_allocator_counters()
        started = time.perf_counter()
        feed = (feed if feed is not None else self.feed(shards)).start()
        writer = CommitThread(commit)
        current: Optional[_Accumulator] = None
        in_flight: "deque[_Launched]" = deque()

        spent = stats.main_thread_seconds
        clock = [time.perf_counter()]

        def lap(step: str) -> None:
            now = time.perf_counter()
            spent[step] += now - clock[0]
            clock[0] = now

        def collect(launched: _Launched) -> None:
            lap("launching")
            self._collect(launched, progress)
            lap("waiting for the device")
            if stats.first_batch_seconds is None:
                stats.first_batch_seconds = time.perf_counter() - started

        closing: "deque[_Accumulator]" = deque()  # shards fully read, waiting for their last batches

        def hand_over_finished() -> None:
            while closing and closing[0].outstanding == 0:
                shard = closing.popleft()
                result = self._result(shard)
                stats.rows += result.rows
                stats.failures += len(result.failures)
                stats.shards += 1
                stats.marks.append((stats.rows + stats.failures, time.perf_counter() - started))
                writer.check()
                lap("launching")
                writer.hand(result)
                lap("handing to the writer")

        try:
            if not self._device_warm:  # the reader and the decoders are at work on the first batches meanwhile
                stats.warm_up_seconds = warm_up_device(self, steps=stats.warm_up_steps)
                self._device_warm = True
                lap("warming up the device")
            while True:
                lap("launching")
                entry = feed.get()
                if isinstance(entry, Batch):
                    wait_for([entry.decoded])  # decoding's wait counted as such, not as launching
                lap("waiting for inputs")
                if entry is DONE:
                    break
                if isinstance(entry, BaseException):
                    raise entry
                if entry is FLUSH:
                    while in_flight:
                        collect(in_flight.popleft())
                    hand_over_finished()
                    continue
                if isinstance(entry, ShardStart):
                    current = _Accumulator(entry.shard)
                elif isinstance(entry, Batch):
                    # the next shard's batches launch before the last ones of this shard are collected
                    launched = self._launch(entry)
                    entry = None  # the decoded inputs' block goes back to the allocator now, not at the next take
                    launched.shard = current
                    current.outstanding += 1
                    in_flight.append(launched)
                    while len(in_flight) > self.batches_in_flight:
                        collect(in_flight.popleft())
                    hand_over_finished()
                elif isinstance(entry, ShardEnd):
                    current.failures.extend(entry.failures)
                    if progress is not None:
                        progress.update(len(entry.failures))
                    closing.append(current)
                    current = None
                    hand_over_finished()
            while in_flight:
                collect(in_flight.popleft())
            hand_over_finished()
            lap("launching")
        finally:
            feed.close()
            writer.stop()
        writer.check()
        stats.seconds = time.perf_counter() - started
        pinned_after = pinned_allocator_counters()
        stats.pinned_blocks_created = pinned_after[0] - pinned_before[0]
        stats.pinned_block_seconds = pinned_after[1] - pinned_before[1]
        stats.pinned_block_bytes = pinned_after[2] - pinned_before[2]
        return stats

