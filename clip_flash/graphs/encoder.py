"""Opt-in CUDA-graph encoding for single-request latency (embedding servers).

    encoder = clip_flash.GraphedEncoder(model)   # model patched (clip_flash.patch) or stock, on a CUDA device
    encoder.capture_all()                        # optional: capture every bucket now, before serving
    features = encoder.encode_image(images)      # model.encode_image's results, from a replayed graph
    features = encoder.encode_text(tokens)       # tokens may stay on the CPU, as the tokenizer returns them

At batch 1 a ViT spends most of its time launching kernels; replaying a captured CUDA graph of the same work
removes that. With ``clip_flash.patch(model, backend="auto")`` and a measured attention table, a capture picks
each attention kernel by its device time (a replay pays no launch), where an eager call picks by its eager time:
a graph's rows are then bit for bit the eager model's under ``clip_flash.backends.choosing_for_replay()`` on the
bucket's shape, and within fp16 rounding of a plain eager call. Choices made here, and why:

Buckets. One graph per batch-size bucket (default 1, 2, 4, 8, 16, 32), per input shape and dtype. A batch is
padded up to the smallest bucket that holds it (rows are independent in every OpenCLIP tower, so padding rows
never change real rows), the graph replays, and the real rows are copied out. A batch above the largest
bucket, an empty batch, or an input on another CUDA device runs eager. When the text tower skips padding
(``clip_flash.patch`` made it ``FlashTextCLIP``/``FlashTextTransformer`` with a text plan), text graphs are
also keyed by a sequence-length bucket (default 8, 16, 24, 32, 48, 64 and always the full context length): the
pooled positions are computed from the tokens before replay (on the CPU when the tokens are there, as the
tokenizer returns them; one small device-to-host copy when they are on the GPU), and the graph runs
``encode_pooled_text(..., cut_length=bucket)``, which never syncs. Otherwise ``model.encode_text`` is
captured at full length. Rows of a text graph's input buffer only ever hold rows whose pooled position fits
that graph's length (zeros at first: pooled at position 0), so stale padding rows are always valid rows.

Memory. All graphs share one memory pool; ``capture_all()`` captures the largest graphs first (images,
then text, largest batch and length first), so the pool is sized by the largest graph's intermediates and
smaller captures reuse it. ``max_graphs`` bounds how many graphs an encoder holds (new input shapes or
dtypes past it run eager). ``stats()`` reports capture time per graph, the pool's segments plus the static
inputs, and the ``memory_allocated``/``memory_reserved`` deltas measured around each capture.

Server safety. One lock around staleness check, copy-in, replay and copy-out. The work runs on the
encoder's own CUDA stream, which first waits on the caller's current stream; the caller's stream then waits
on it, so callers on any stream see finished results and cannot race each other. Inputs are copied into the
graph's static buffer; outputs are copied into a fresh tensor allocated on the caller's stream, so a caller
never holds a buffer that a later call overwrites. Captures are serialized process-wide and run in
``thread_local`` capture mode, so eager CUDA work in other threads cannot invalidate them; still, calling
``capture_all()`` before serving keeps capture cost off the request path.

Never replay stale: see ``staleness.py``. Capture, the memory pool and failed-capture recovery: see
``capture.py``.

Eager fallback, with the reason logged once per reason (logger ``clip_flash.graphs.encoder``): a model not on a
CUDA device, autocast enabled by the caller (graphs hold the model's own dtypes), an input shape the text
graphs do not cover, and a capture that fails (a tower or backend that syncs the host, for instance): that
key then runs eager for the encoder's lifetime. Inputs the model
cannot take raise ``ValueError`` before any work: an input on another device than the model (CPU inputs are
copied to the model's device), images not in the vision tower's dtype (autocast off), token ids that are not
integers. Other errors of the model itself surface from the warm-up exactly as eager would raise them.

Results are inference tensors (every call runs under ``torch.inference_mode()``), on the model's device.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..patching.text_fast_path import encode_pooled_text, pooled_positions
from .capture import CapturedGraph, GraphKey
from .model_state import EncoderSetup, bucket_table, build_setup, validated

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_TEXT_LENGTHS = (8, 16, 24, 32, 48, 64, 77)
DEFAULT_MAX_GRAPHS = 64
# The PyTorch CUDA-graph docs warm up a few iterations on a side stream before capturing: lazy initialization
# (cuBLAS handles and workspaces, cuDNN plans, Triton compilation and autotuning) must not happen in capture.
DEFAULT_WARMUP_ITERS = 3


class GraphStats(dict):
    """What a ``GraphedEncoder`` holds and has done (``encoder.stats()``): a plain dict whose keys also read as
    attributes (``stats["graphs"] == stats.graphs``).

    Keys:
        graphs: graphs held.
        capture_seconds: per captured graph (described as text), warm-up included.
        total_capture_seconds: their sum.
        failed_captures: per graph key that runs eager: why its capture failed.
        pool_memory_bytes: ``torch.cuda.memory_reserved`` delta summed over the captures of the graphs held now
            (reset when the graphs are dropped).
        graph_memory_bytes: the shared pool's segments (from the allocator's snapshot of that pool) plus the
            static inputs: what the graphs hold now.
        allocated_delta_bytes / reserved_delta_bytes: ``memory_allocated`` / ``memory_reserved`` deltas summed over
            every capture of this encoder's lifetime.
        replays, eager_calls: call counters.
        invalidations: times the graphs were dropped because the model changed.
        no_graphs: per tower that cannot be graphed at all: why.
    """

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None



class GraphedEncoder:
    """Encodes images and text with CUDA graphs captured per batch bucket; same results as the model's own calls.

    Args:
        model: an OpenCLIP model (``CLIP``, ``CustomTextCLIP``), patched with ``clip_flash.patch`` or stock, in
            eval mode. On the CPU everything runs eager (logged once).
        batch_sizes: batch-size buckets; a batch is padded up to the smallest bucket that holds it, batches above
            the largest run eager.
        text_lengths: sequence-length buckets for a text tower that skips padding (ignored otherwise); lengths
            above the context length are dropped and the context length is always added.
        max_graphs: at most this many graphs are held (inputs that would need more run eager).
        warmup_iters: eager runs on the encoder's stream before each capture.

    Thread-safe: calls from any thread and any CUDA stream may overlap. See the module docstring for what is
    detected when the model changes (graphs are re-captured) and what raises (training mode).
    """

    def __init__(
        self,
        model: nn.Module,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        text_lengths: Sequence[int] = DEFAULT_TEXT_LENGTHS,
        *,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        warmup_iters: int = DEFAULT_WARMUP_ITERS,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"GraphedEncoder expects an nn.Module, got {type(model).__name__}")
        self.model = model
        self.batch_sizes = validated(batch_sizes, "batch_sizes")
        self.text_lengths = validated(text_lengths, "text_lengths")
        if max_graphs < 1 or warmup_iters < 1:
            raise ValueError("max_graphs and warmup_iters must be at least 1")
        self.max_graphs = max_graphs
        self.warmup_iters = warmup_iters
        self._batch_for = bucket_table(self.batch_sizes)
        self._lock = threading.Lock()
        self._logged_lock = threading.Lock()
        self._logged: set = set()
        self._setup: Optional[EncoderSetup] = None
        self._streams: Dict[torch.device, "torch.cuda.Stream"] = {}
        self._replays = 0
        self._eager_calls = 0
        self._invalidations = 0
        self._allocated_delta = 0
        self._reserved_delta = 0

    # -- public API ---------------------------------------------------------------------------------------------
    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """``model.encode_image(images, normalize)`` from a replayed graph where one fits (eager otherwise).

        ``images`` may be on the CPU or on the model's device, in the dtype the model takes.
        """
        n = images.shape[0]
        with torch.inference_mode():
            with self._lock:
                setup = self._fresh_setup("image")
                self._check_input(setup, "image", images)
                entry = self._image_entry(setup, images, n)
                if type(entry) is CapturedGraph:
                    return self._replay(setup, entry, images, n, normalize)
            return self._eager(setup, self.model.encode_image, images, normalize, entry)

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """``model.encode_text(tokens, normalize)`` from a replayed graph where one fits (eager otherwise).

        ``tokens`` may be on the CPU (as the tokenizer returns them: no GPU sync to pick the length bucket) or on
        the model's device (one small device-to-host copy when the text tower skips padding).
        """
        n = tokens.shape[0]
        with torch.inference_mode():
            setup = self._setup
            # Pick the length bucket before taking the lock: for GPU tokens it waits on the caller's stream.
            length = None
            if setup is not None:
                self._check_input(setup, "text", tokens)
                length = self._length_of(setup, tokens)
            with self._lock:
                fresh = self._fresh_setup("text")
                self._check_input(fresh, "text", tokens)
                if fresh is not setup:  # first call, or the model changed since: the plan may differ
                    length = self._length_of(fresh, tokens)
                entry = self._text_entry(fresh, tokens, n, length)
                if type(entry) is CapturedGraph:
                    return self._replay(fresh, entry, tokens, n, normalize)
            return self._eager(fresh, self.model.encode_text, tokens, normalize, entry)

    def capture_all(self, image_shape: Optional[Sequence[int]] = None, image_dtype: Optional[torch.dtype] = None,
                    token_dtype: torch.dtype = torch.long) -> GraphStats:
        """Capture every bucket of both towers now, largest first (so the shared pool is sized once).

        Args:
            image_shape: per-image shape, default ``(3, H, W)`` from ``model.visual.image_size``.
            image_dtype: default the dtype of the vision tower's first convolution.
            token_dtype: dtype of the token ids the server will pass (the tokenizer's is ``torch.long``).
        Towers that cannot be graphed are skipped (their reason is logged and in ``stats().no_graphs``).
        """
        with torch.inference_mode(), self._lock:
            self._fresh_setup("image")
            setup = self._fresh_setup("text")  # if this one rebuilds, the new setup is fresh for both towers
            keys: List[GraphKey] = []
            if setup.no_graphs["image"] is None and hasattr(self.model, "encode_image"):
                shape = tuple(image_shape) if image_shape is not None else self._default_image_shape()
                dtype = image_dtype or setup.image_dtype
                keys += [GraphKey("image", b, shape, dtype) for b in reversed(self.batch_sizes)]
            if setup.no_graphs["text"] is None and hasattr(self.model, "encode_text"):
                width = setup.context_length
                if width is None:
                    raise ValueError("the model has no context_length: capture text lazily, from encode_text calls")
                lengths = sorted({setup.length_for[n] for n in range(1, width + 1)}, reverse=True) \
                    if setup.text_plan is not None else [width]
                keys += [GraphKey("text", b, (width,), token_dtype, length)
                         for b in reversed(self.batch_sizes) for length in lengths]
            towers_by_reason: Dict[str, List[str]] = {}
            for name, reason in setup.no_graphs.items():
                if reason is not None:
                    towers_by_reason.setdefault(reason, []).append(name)
            for reason, names in towers_by_reason.items():
                towers = " and ".join(names) + (" towers run" if len(names) > 1 else " tower runs")
                self._log_once(logging.WARNING, f"{towers} eager: {reason}", key=reason)
            for key in keys:
                if key not in setup.graphs and len(setup.graphs) < self.max_graphs:
                    self._capture(setup, key)
            return self._stats_locked()

    def batch_bucket(self, n: int) -> Optional[int]:
        """The batch bucket a batch of ``n`` rows is padded to (None: it runs eager)."""
        return self._batch_for[n] if 0 <= n < len(self._batch_for) else None

    def length_bucket(self, tokens: torch.Tensor) -> int:
        """The sequence length the text graph for ``tokens`` computes: a length bucket when the text tower skips
        padding, the full token width otherwise."""
        with self._lock:
            setup = self._fresh_setup("text")
        with torch.inference_mode():
            return self._length_of(setup, tokens)

    def stats(self) -> GraphStats:
        """Capture time, graphs held, extra GPU memory they hold, and call counters."""
        with self._lock:
            return self._stats_locked()

    @property
    def memory_bytes(self) -> int:
        """GPU memory the graphs hold: the shared pool's segments plus the static input buffers."""
        return self.stats().graph_memory_bytes

    def release(self) -> None:
        """Drop every graph and hand the pool's memory back; later calls set up and capture again as needed."""
        with self._lock:
            if self._setup is not None:
                self._drop(self._setup)
                self._setup = None

    # -- setup and staleness ------------------------------------------------------------------------------------
    def _fresh_setup(self, tower: str) -> EncoderSetup:
        """The current setup, rebuilt first if the model changed since it was made (caller holds the lock)."""
        setup = self._setup
        if setup is None:
            setup = self._setup = build_setup(self.model, self.text_lengths, self._streams)
        watch = setup.watches[tower]
        if watch.training:
            raise RuntimeError("GraphedEncoder encodes for inference, but the model is in training mode: "
                               "call model.eval() first")
        reason = watch.stale_reason()
        if reason is not None:
            logger.info("GraphedEncoder: %s tower changed (%s): dropping %d graph(s), capturing again as needed",
                        tower, reason, sum(type(e) is CapturedGraph for e in setup.graphs.values()))
            self._invalidations += 1
            self._drop(setup)
            setup = self._setup = build_setup(self.model, self.text_lengths, self._streams)
        return setup

    def _drop(self, setup: EncoderSetup) -> None:
        """Free a setup's graphs and pool (caller holds the lock)."""
        for watch in setup.watches.values():
            watch.close()
        had_graphs = any(type(e) is CapturedGraph for e in setup.graphs.values())
        if setup.space is not None:
            # A replay may still be running on the stream and reading the static buffers about to be freed.
            setup.space.stream.synchronize()
        setup.graphs.clear()
        if had_graphs:
            # With its graphs gone the private pool is only marked freeable; empty_cache returns it to the device.
            torch.cuda.empty_cache()

    # -- choosing the graph -------------------------------------------------------------------------------------
    @staticmethod
    def _check_input(setup: EncoderSetup, tower: str, x: torch.Tensor) -> None:
        """Raise ``ValueError`` for an input the model cannot take: on another device than the model (CPU inputs
        are copied to a CUDA model's device), images not in the model's dtype (unless autocast is on), or
        token ids that are not integers."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"GraphedEncoder.encode_{tower} expects a tensor, got {type(x).__name__}")
        if x.device.type != "cpu" and x.device != setup.device:
            raise ValueError(f"GraphedEncoder: {tower} input is on {x.device} but the model is on {setup.device}; "
                             f"move it to {setup.device} (or pass it on the CPU)")
        if tower == "image":
            expected = setup.image_dtype
            if expected is not None and x.dtype != expected and \
                    not torch.is_autocast_enabled(setup.device.type):
                raise ValueError(f"GraphedEncoder: images are {x.dtype} but the model's vision tower takes {expected}; "
                                 f"convert them with images.to({expected})")
        elif x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"GraphedEncoder: token ids must be an integer tensor, got {x.dtype}")

    def _usable_input(self, setup: EncoderSetup, tower: str, x: torch.Tensor) -> Optional[str]:
        """Why ``x`` cannot go through a graph of this setup (None: it can)."""
        reason = setup.no_graphs[tower]
        if reason is not None:
            return reason
        if torch.is_autocast_enabled("cuda"):
            return "autocast is enabled: the graphs compute in the model's own dtypes"
        return None

    def _image_entry(self, setup: EncoderSetup, images: torch.Tensor, n: int) -> Union[CapturedGraph, str]:
        reason = self._usable_input(setup, "image", images)
        if reason is not None:
            return reason
        bucket = self.batch_bucket(n)
        if bucket is None:
            return f"batch size outside 1..{self.batch_sizes[-1]} (the largest bucket)"
        return self._entry(setup, GraphKey("image", bucket, tuple(images.shape[1:]), images.dtype))

    def _length_of(self, setup: EncoderSetup, tokens: torch.Tensor) -> int:
        if setup.text_plan is None or tokens.dim() != 2 or tokens.shape[1] != setup.context_length \
                or tokens.shape[0] == 0:
            return tokens.shape[-1]
        plan = setup.text_plan
        longest = int(pooled_positions(tokens, plan.pool_type, plan.eos_id).max()) + 1
        return setup.length_for[longest]

    def _text_entry(self, setup: EncoderSetup, tokens: torch.Tensor, n: int, length: int) -> Union[CapturedGraph, str]:
        reason = self._usable_input(setup, "text", tokens)
        if reason is not None:
            return reason
        if tokens.dim() != 2 or (setup.text_plan is not None and tokens.shape[1] != setup.context_length):
            return f"token shape {tuple(tokens.shape)} is not (batch, {setup.context_length})"
        bucket = self.batch_bucket(n)
        if bucket is None:
            return f"batch size outside 1..{self.batch_sizes[-1]} (the largest bucket)"
        return self._entry(setup, GraphKey("text", bucket, (tokens.shape[1],), tokens.dtype, length))

    def _entry(self, setup: EncoderSetup, key: GraphKey) -> Union[CapturedGraph, str]:
        entry = setup.graphs.get(key)
        if entry is not None:
            return entry
        if len(setup.graphs) >= self.max_graphs:
            return f"max_graphs={self.max_graphs} graphs held already"
        return self._capture(setup, key)

    # -- capture, replay, eager ---------------------------------------------------------------------------------
    def _graphed_function(self, setup: EncoderSetup, key: GraphKey) -> Tuple[Tuple[int, ...], Callable]:
        """(static input shape, function of the static input) for a graph key."""
        if key.tower == "image":
            return key.input_shape, self.model.encode_image
        if setup.text_plan is not None:
            tower, plan, length = setup.text_tower, setup.text_plan, key.length
            # With cut_length the padding-skipping path never reads device values on the host: capturable.
            return key.input_shape, lambda tokens: encode_pooled_text(tower, tokens, plan, cut_length=length)
        return key.input_shape, self.model.encode_text

    def _capture(self, setup: EncoderSetup, key: GraphKey) -> Union[CapturedGraph, str]:
        """Capture one graph into the setup's pool (caller holds the lock, in inference mode); a failed capture
        marks the key eager for this setup, with the reason logged."""
        _, function = self._graphed_function(setup, key)
        captured = setup.space.capture(key, function, self.warmup_iters)
        setup.graphs[key] = captured
        if isinstance(captured, str):
            self._log_once(logging.WARNING, captured + "; it runs eager from now on")
            return captured
        self._allocated_delta += captured.allocated_delta
        self._reserved_delta += captured.reserved_delta
        logger.debug("captured %s in %.3f s", key.describe(), captured.seconds)
        return captured

    def _replay(self, setup: EncoderSetup, captured: CapturedGraph, x: torch.Tensor, n: int,
                normalize: bool) -> torch.Tensor:
        out = setup.space.replay(captured, x, n, normalize)
        self._replays += 1
        return out

    def _eager(self, setup: EncoderSetup, encode: Callable, x: torch.Tensor, normalize: bool,
               reason: str) -> torch.Tensor:
        # Batches past the buckets are expected, and failed captures were already warned about when they failed.
        level = logging.INFO if reason.startswith("batch size") or "capture" in reason else logging.WARNING
        self._log_once(level, f"running eager: {reason}", key=reason)
        with self._logged_lock:
            self._eager_calls += 1
        if x.device.type == "cpu" and setup.device.type != "cpu":
            x = x.to(setup.device, non_blocking=True)
        return encode(x, normalize=normalize)

    # -- reporting ----------------------------------------------------------------------------------------------
    def _log_once(self, level: int, message: str, key: Optional[str] = None) -> None:
        """Log ``message`` unless one with the same ``key`` (default: the message) was logged already."""
        key = message if key is None else key
        with self._logged_lock:
            if key in self._logged:
                return
            self._logged.add(key)
        logger.log(level, "GraphedEncoder: %s", message)

    def _default_image_shape(self) -> Tuple[int, ...]:
        size = getattr(getattr(self.model, "visual", None), "image_size", None)
        if size is None:
            raise ValueError("model.visual has no image_size: pass capture_all(image_shape=(3, H, W))")
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        return (3, int(height), int(width))

    def _stats_locked(self) -> GraphStats:
        setup = self._setup
        graphs = setup.graphs if setup is not None else {}
        captured = {key: e for key, e in graphs.items() if type(e) is CapturedGraph}
        memory = 0
        if captured:
            memory = sum(e.static_input.numel() * e.static_input.element_size() for e in captured.values())
            memory += setup.space.pool_bytes(self._reserved_delta)
        capture_seconds = {key.describe(): e.seconds for key, e in captured.items()}
        return GraphStats(
            graphs=len(captured),
            capture_seconds=capture_seconds,
            total_capture_seconds=sum(capture_seconds.values()),
            pool_memory_bytes=setup.space.reserved_delta if setup is not None and setup.space else 0,
            failed_captures={key.describe(): e for key, e in graphs.items() if type(e) is str},
            graph_memory_bytes=memory,
            allocated_delta_bytes=self._allocated_delta,
            reserved_delta_bytes=self._reserved_delta,
            replays=self._replays,
            eager_calls=self._eager_calls,
            invalidations=self._invalidations,
            no_graphs={name: r for name, r in (setup.no_graphs.items() if setup else ()) if r is not None},
        )

    def __repr__(self) -> str:
        return (f"GraphedEncoder({type(self.model).__name__}, batch_sizes={self.batch_sizes}, "
                f"text_lengths={self.text_lengths})")
