"""The engine: one model on one device, its inputs and encoders, and a dynamic batcher per tower; and the pool
of engines (one per GPU, ``--devices 0,1``) that the HTTP side submits to.

Loading (``load``) runs off the event loop: the server answers ``/health`` at once and ``/ready`` 503 until the
model is loaded, patched and every CUDA graph the batchers can use is captured.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .config import ServeConfig
from .jobs import IMAGE, TEXT, DROPPED, QUEUED, EmbeddingJob, NotReady, QueuedInputs, ServerBusy

logger = logging.getLogger(__name__)

LOADING, READY, FAILED, STOPPED = "loading", "ready", "failed", "stopped"


IMAGE_BUCKETS_PER_OCTAVE = 4  # past 8 rows an image batch pads to a graph under 25% larger (about 8% on average)


def batch_buckets(largest: int, per_octave: int = 1) -> Tuple[int, ...]:
    """The batch sizes graphs are captured for: 1, 2, 4, 8, then ``per_octave`` evenly spaced sizes in each
    doubling (16, 32, ... with 1; 10, 12, 14, 16, 20, 24, ... with 4), and ``largest`` itself.

    A batch runs the smallest graph that holds it, its padding rows computed and dropped. Under load the image
    batches of a server land anywhere between 8 and ``max_batch``: with powers of two alone a batch of 33 pays
    for 64 rows, and on average a third more rows are computed than asked for; ViT graphs are cheap to hold (one
    memory pool), so images get finer steps (at 1,600 one-JPEG requests/s on an H100, powers of two alone gave
    about twice the p50: ``benchmarks/results/h100/serve_ab_80bab2b``). Text graphs multiply by the length buckets,
    and the length groups of a caption batch pad the same way: their steps are ``text_graphs_per_doubling``
    (``ServeConfig``)."""
    sizes, low = [1, 2, 4], 8
    while low < largest:
        step = max(1, low // per_octave)
        sizes.extend(range(low, min(2 * low, largest), step))
        low *= 2
    return tuple(sorted(set(size for size in sizes if size < largest))) + (largest,)


def freeze_loaded_objects() -> None:
    """Move every object alive now (the model, its modules and tensors, the imported libraries: hundreds of
    thousands) out of the garbage collector's generations, for good: they live as long as the server. A full
    collection holds the GIL while it scans every tracked object; requests' short-lived objects trigger one
    every few seconds at 10,000 requests/s, and with those objects in it each took about 200 ms (the no-op
    engine's p99 latency went from 234 ms to 2 ms at 10,000 captions/s, ``benchmarks/serve/engine_rate.py``)."""
    import gc

    gc.collect()
    gc.freeze()


def single_threaded_host_ops(device: Any) -> bool:
    """On a CUDA device, torch's CPU ops in this process run on the calling thread (``torch.set_num_threads(1)``);
    True when set.

    The engine's CPU work is per batch and small (token ids, packing, result rows). With torch's intra-op pool, a
    batcher thread's first parallel op starts an OpenMP team of one thread per core, and libgomp's threads spin
    300,000 times before sleeping while there are no more of them than cores: a fresh server on a 16-core H100
    host, fed 950 requests of 64 captions a second, started one such team in 1 of 7 runs, whose spinning took
    6-12 cores from the HTTP frontends and the load generator while 1,024-caption batches queued
    (``benchmarks/results/h100/text_buckets_04bca1b/first_point``). On the CPU the model needs the pool: left as is.
    """
    import torch

    if torch.device(device).type != "cuda":
        return False
    if torch.get_num_threads() != 1:
        logger.info("torch CPU ops in the engine process run on one thread (was %d): the GPU does the model's "
                    "work, and an OpenMP team per batcher thread would spin on the cores the frontends use",
                    torch.get_num_threads())
        torch.set_num_threads(1)
    return True


def without_cudnn_attention(device: Any) -> bool:
    """On a CUDA device, turn PyTorch's cuDNN attention off in this process
    (``torch.backends.cuda.enable_cudnn_sdp(False)``); True when it was on. ``--no-cudnn-attention`` asks for it.

    ``scaled_dot_product_attention`` then takes its flash (or memory-efficient) kernel where it would have taken
    cuDNN's. cuDNN builds an execution plan for each new shape it meets, and a server meets hundreds at start-up,
    one per graph. On an H200 (``benchmarks/results/h200/startup_cudnn_bef6db5``) the engine loaded in 22.9 s
    instead of 41.8 for ViT-L-14 and in 15.5 instead of 29.3 for ViT-B-32, but cuDNN's kernels replay faster in
    most shapes: without them ViT-L-14's image graphs took 2-5% longer and its caption graphs up to 8%, ViT-B-32's
    caption graphs 7-19% longer at 16-1,024 rows (its image graphs 4-19% shorter), and a ViT-L-14 server passed
    2,497 one-JPEG requests/s against 2,667 with cuDNN (64 captions a request: 94,336 and 94,343 captions/s). So
    it stays on unless start-up matters more. Process-wide, so graphs and eager calls, and the engines of
    ``--devices 0,1``, all run the same kernels."""
    import torch

    if torch.device(device).type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    logger.info("PyTorch's cuDNN attention is off in the engine process (--no-cudnn-attention): no per-shape "
                "plans to build at start-up; SDPA takes its flash kernel instead")
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


def _inputs(runs: Sequence[QueuedInputs]) -> int:
    return sum(len(run.indices) for run in runs)


class Engine:
    """One model on one device serving both towers. Thread-safe; ``submit`` is called from event loops."""

    def __init__(self, config: ServeConfig, device_name: Optional[str] = None, metrics=None) -> None:
        self.config = config
        self.device_name = device_name
        self.metrics = metrics
        self.state = LOADING
        self.error: Optional[str] = None
        self.description = ""  # what runs: model, weights, device, precision, patch, inputs, graphs
        self.lock = threading.Lock()
        self.queued = 0
        self.batchers = {}
        self.loaded = None
        self.embedding_width: Optional[int] = None  # floats per embedding, once loaded
        self.text_costs = None  # the text graphs' replay times (padded and packed), once measured

    # -- loading -------------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Load, patch and warm up; sets ``state`` to READY, or FAILED with ``error`` (never raises)."""
        try:
            self._load()
            freeze_loaded_objects()
            self.state = READY
        except Exception as error:  # noqa: BLE001 - reported through /ready and the log
            from clip_flash.models import ModelLoadError

            # ModelLoadError's text opens with "error: " for the command line; here it follows "failed to load: "
            self.error = (str(error).removeprefix("error: ") if isinstance(error, ModelLoadError)
                          else f"{type(error).__name__}: {error}")
            self.state = FAILED
            logger.error("engine on %s failed to load: %s", self.device_name or "the default device", self.error,
                         exc_info=not isinstance(error, ModelLoadError))

    def _load(self) -> None:
        import contextlib

        import torch

        device = torch.device(self.device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        # This thread's current device is the engine's (--devices 0,1 loads each engine on its own thread).
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            self._load_on(device)

    def _load_on(self, device) -> None:

        from clip_flash.models import load_model, parse_model_spec

        from .batcher import TowerBatcher
        from .inputs import FastImageInputs, StockImageInputs, TextInputs

        config = self.config
        started = time.perf_counter()
        if not config.cudnn_attention:
            without_cudnn_attention(device)
        precision = config.precision or ("fp16" if device.type == "cuda" else "fp32")
        spec = parse_model_spec(config.model)
        loaded = load_model(spec, device, precision)
        self.loaded = loaded
        model = loaded.model
        self.embedding_width = loaded.embedding_width
        if config.patch:
            import clip_flash

            clip_flash.patch(model)
        single_threaded_host_ops(device)  # after loading: OpenCLIP builds the model (and draws random init) on the CPU
        if config.inputs == "fast":
            from clip_flash.inputs.text.tokenizer import get_tokenizer

            image_inputs = FastImageInputs(loaded.preprocess, device, loaded.dtype, config.decode,
                                           config.decode_workers, config.max_batch, config.split_jpegs)
            tokenizer = get_tokenizer(spec.name)
        else:
            import open_clip

            image_inputs = StockImageInputs(loaded.preprocess, device, loaded.dtype, loaded.image_size)
            tokenizer = open_clip.get_tokenizer(spec.name)
        # fast inputs: get_tokenizer(spec.name) gives the same ids in any process, so frontends may tokenize
        text_inputs = TextInputs(tokenizer, loaded.context_length, group_by_length=config.patch,
                                 name=spec.name if config.inputs == "fast" else None)
        encode_image, encode_text = model.encode_image, model.encode_text
        graphs = device.type == "cuda" and config.cuda_graphs
        if graphs:
            encode_image, encode_text = self._graphed(model, loaded, device)
            if self.text_costs is not None and text_inputs.group_by_length:
                text_inputs.replay_costs = self.text_costs
        shared = dict(lock=self.lock, on_dequeue=self._dequeued, metrics=self.metrics, device=device,
                      close_when_idle=not config.wait_when_idle, max_in_flight=config.max_batches_in_flight)
        self.batchers = {
            IMAGE: TowerBatcher(IMAGE, image_inputs, encode_image, config.max_batch, config.max_wait_ms / 1e3,
                                launch_early=config.early_launch, **shared),
            TEXT: TowerBatcher(TEXT, text_inputs, encode_text, config.max_text_batch, config.max_wait_ms / 1e3,
                               **shared),
        }
        self.description = (f"{spec.text} {spec.weights_note}".strip() + f" on {device}, {precision}, "
                            f"{'patched' if config.patch else 'stock model'}, "
                            f"{'clip_flash' if config.inputs == 'fast' else 'OpenCLIP'} inputs"
                            f"{' (decode=gpu)' if config.decode == 'gpu' else ''}, "
                            f"{'CUDA graphs' if graphs else 'eager'}")
        logger.info("engine ready in %.1f s: %s", time.perf_counter() - started, self.description)

    def _graphed(self, model, loaded, device) -> Tuple[Callable, Callable]:
        """Image and text ``GraphedEncoder``s with every bucket the batchers can hit captured now (largest
        first, so each encoder's memory pool is sized once)."""
        import torch

        from clip_flash.graphs import GraphedEncoder
        from clip_flash.graphs.encoder import DEFAULT_TEXT_LENGTHS

        from .text_graphs import ReplayCosts, capture_text_graphs, time_text_replays, with_packed_graphs

        config = self.config
        image_sizes = batch_buckets(config.max_batch, IMAGE_BUCKETS_PER_OCTAVE)
        text_sizes = batch_buckets(config.max_text_batch, config.text_graphs_per_doubling)
        lengths = [n for n in DEFAULT_TEXT_LENGTHS if n <= loaded.context_length] + [loaded.context_length]
        lengths = sorted(set(lengths))
        images = GraphedEncoder(model, batch_sizes=image_sizes, max_graphs=len(image_sizes))
        # One eager run before each text capture, not three: the lazy set-up a capture must not meet (cuBLAS
        # workspaces, a shape's cuDNN plan) happens in the first, and the server captures hundreds of text graphs.
        texts = GraphedEncoder(model, batch_sizes=text_sizes, text_lengths=lengths,
                               max_graphs=len(text_sizes) * len(lengths), warmup_iters=1)
        started = time.perf_counter()
        height, width = loaded.image_size
        for size in reversed(image_sizes):
            images.encode_image(torch.zeros((size, 3, height, width), dtype=loaded.dtype, device=device))
        capture_text_graphs(texts, text_sizes, lengths, loaded.context_length)
        torch.cuda.synchronize(device)
        encode_text = texts.encode_text
        if config.text_grouping in ("cost", "cost-packed") and texts.stats().graphs:
            timed = time.perf_counter()
            self.text_costs = ReplayCosts(time_text_replays(texts, text_sizes, lengths, loaded.context_length))
            logger.info("timed %d text graph replays in %.1f s (caption batches are cut where they cost least)",
                        len(self.text_costs.ms), time.perf_counter() - timed)
            if config.text_grouping == "cost-packed":
                encode_text = with_packed_graphs(model, texts.encode_text, self.text_costs, config.max_text_batch)
        stats_i, stats_t = images.stats(), texts.stats()
        logger.info("captured %d image and %d text CUDA graphs in %.1f s (%.0f MiB)", stats_i.graphs, stats_t.graphs,
                    time.perf_counter() - started,
                    (stats_i.graph_memory_bytes + stats_t.graph_memory_bytes) / 2**20)
        self.graph_stats = (stats_i, stats_t)
        return images.encode_image, encode_text

    # -- the queue -----------------------------------------------------------------------------------------------
    def _dequeued(self, count: int) -> None:
        self.queued -= count  # called with self.lock held

    def queue_depth(self, tower: str) -> int:
        batcher = self.batchers.get(tower)
        return len(batcher) if batcher is not None else 0

    def submit(self, job: EmbeddingJob, images: Sequence[QueuedInputs], texts: Sequence[QueuedInputs],
               limit: int) -> None:
        """Queue a request's inputs, all or none: ``ServerBusy`` when ``limit`` inputs would be passed."""
        if self.state != READY:
            if self.state == STOPPED:
                raise NotReady("the server is shutting down")
            raise NotReady(self.error or "the model is still loading")
        count = _inputs(images) + _inputs(texts)
        now = time.monotonic()
        with self.lock:
            if self.queued + count > limit:
                raise ServerBusy(f"{self.queued} inputs are queued already; this request's {count} would pass the "
                                 f"limit of {limit} (--max-queue)")
            if self.batchers[IMAGE].stopping:
                raise NotReady("the server is shutting down")
            self.queued += count
            if images:
                self.batchers[IMAGE].put_locked(images, now)
            if texts:
                self.batchers[TEXT].put_locked(texts, now)

    def submit_many(self, requests: Sequence[Tuple[EmbeddingJob, Sequence[QueuedInputs], Sequence[QueuedInputs]]],
                    limit: int) -> List[Tuple[int, Exception]]:
        """``submit`` for several requests under one lock hold and one wake-up of each tower's collector (a
        frame's worth from a frontend). Each request is still queued all or none; returns the refused ones as
        (position in ``requests``, ``ServerBusy``/``NotReady``)."""
        if self.state != READY:
            error = NotReady("the server is shutting down" if self.state == STOPPED
                             else self.error or "the model is still loading")
            return [(position, error) for position in range(len(requests))]
        refused: List[Tuple[int, Exception]] = []
        images_all: List[QueuedInputs] = []
        texts_all: List[QueuedInputs] = []
        now = time.monotonic()
        with self.lock:
            if self.batchers[IMAGE].stopping:
                error = NotReady("the server is shutting down")
                return [(position, error) for position in range(len(requests))]
            for position, (_, images, texts) in enumerate(requests):
                count = _inputs(images) + _inputs(texts)
                if self.queued + count > limit:
                    refused.append((position, ServerBusy(
                        f"{self.queued} inputs are queued already; this request's {count} would pass the limit "
                        f"of {limit} (--max-queue)")))
                    continue
                self.queued += count
                images_all.extend(images)
                texts_all.extend(texts)
            if images_all:
                self.batchers[IMAGE].put_locked(images_all, now)
            if texts_all:
                self.batchers[TEXT].put_locked(texts_all, now)
        return refused

    def abandon(self, images: Sequence[QueuedInputs], texts: Sequence[QueuedInputs] = ()) -> int:
        """Drop a request's inputs still queued (its client went away, or its deadline passed): they are never
        computed. Returns how many were dropped."""
        dropped = {IMAGE: 0, TEXT: 0}
        with self.lock:
            for tower, runs in ((IMAGE, images), (TEXT, texts)):
                for run in runs:
                    if run.state == QUEUED:
                        run.state = DROPPED
                        dropped[tower] += len(run.indices)
            self.queued -= dropped[IMAGE] + dropped[TEXT]
        if self.metrics is not None:
            for tower, count in dropped.items():
                if count:
                    self.metrics.dropped(tower, count)
        return dropped[IMAGE] + dropped[TEXT]

    def close(self) -> None:
        """Answer everything queued, then stop the batchers' threads and the decoding workers."""
        if self.state == READY:
            self.state = STOPPED
        for batcher in self.batchers.values():
            batcher.close()
        for batcher in self.batchers.values():
            batcher.inputs.close()


class EnginesTogether:
    """Several engines' state, error, description and queue depths as one server's (``members``: the engines, in
    this process or behind sockets): failed if any failed, else loading while any loads, else stopped if any
    stopped, else ready."""

    members: Sequence[Any] = ()

    @property
    def state(self) -> str:
        states = {member.state for member in self.members}
        for state in (FAILED, LOADING, STOPPED):
            if state in states:
                return state
        return READY

    @property
    def error(self) -> Optional[str]:
        return next((member.error for member in self.members if member.error), None)

    @property
    def description(self) -> str:
        return "; ".join(member.description for member in self.members if member.description)

    @property
    def embedding_width(self) -> Optional[int]:
        """Floats per embedding, as the ready engines report it; None while none is ready (or they disagree)."""
        widths = {member.embedding_width for member in self.members if member.state == READY}
        return widths.pop() if len(widths) == 1 else None

    def queue_depth(self, tower: str) -> int:
        return sum(member.queue_depth(tower) for member in self.members)


class EnginePool(EnginesTogether):
    """The engines of one server (one per device); a request goes whole to the least loaded ready engine."""

    def __init__(self, config: ServeConfig) -> None:
        from .metrics import ServeMetrics

        self.config = config
        self.metrics = ServeMetrics(self.queue_depth)  # the server's one registry, its engines' counts in it
        self.engines: List[Engine] = [Engine(config, name, self.metrics) for name in config.device_names()]
        self.members = self.engines
        self.limit = -(-config.max_queue // len(self.engines))

    def load(self) -> None:
        """Load every engine (in parallel: each waits mostly on its own device)."""
        if len(self.engines) == 1:
            self.engines[0].load()
            return
        threads = [threading.Thread(target=engine.load, name=f"clip_flash-load-{i}")
                   for i, engine in enumerate(self.engines)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    @property
    def text_tokenizer(self) -> Optional[Tuple[str, int]]:
        """(``get_tokenizer`` name, context length) that reproduce every ready engine's caption ids in another
        process; None when there is none (still loading, ``--inputs stock``, engines that differ)."""
        specs = {getattr(engine.batchers[TEXT].inputs, "remote_spec", None)
                 for engine in self.engines if engine.state == READY}
        return specs.pop() if len(specs) == 1 else None

    def submit(self, job: EmbeddingJob, images: Sequence[QueuedInputs], texts: Sequence[QueuedInputs]) -> Engine:
        ready = [engine for engine in self.engines if engine.state == READY]
        if not ready:
            return self.engines[0].submit(job, images, texts, self.limit)  # raises NotReady with the reason
        engine = min(ready, key=lambda e: e.queued)
        engine.submit(job, images, texts, self.limit)
        return engine

    def submit_many(self, requests: Sequence[Tuple[EmbeddingJob, Sequence[QueuedInputs], Sequence[QueuedInputs]]]
                    ) -> Tuple[List[Optional[Engine]], List[Tuple[int, Exception]]]:
        """Queue several requests (each whole to one engine): (the engine each went to, None if refused;
        the refusals as (position, error)). With one engine, one lock hold for them all."""
        ready = [engine for engine in self.engines if engine.state == READY]
        if len(self.engines) == 1 or not ready:
            engine = ready[0] if ready else self.engines[0]
            refused = engine.submit_many(requests, self.limit)
            engines: List[Optional[Engine]] = [engine] * len(requests)
            for position, _ in refused:
                engines[position] = None
            return engines, refused
        engines, refused = [], []
        for position, (job, images, texts) in enumerate(requests):
            try:
                engines.append(self.submit(job, images, texts))
            except (ServerBusy, NotReady) as error:
                engines.append(None)
                refused.append((position, error))
        return engines, refused

    def close(self) -> None:
        for engine in self.engines:
            engine.close()

