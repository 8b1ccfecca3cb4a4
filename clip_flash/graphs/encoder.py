"""Opt-in CUDA-graph encoding for single-request latency (embedding servers).

    encoder = clip_flash.GraphedEncoder(model)   # model patched (clip_flash.patch) or stock, on a CUDA device
    encoder.capture_all()                        # optional: capture every bucket now, before serving
    features = encoder.encode_image(images)      # same results as model.encode_image, from a replayed graph
    features = encoder.encode_text(tokens)       # tokens may stay on the CPU, as the tokenizer returns them

At batch 1 a ViT spends most of its time launching kernels; replaying a captured CUDA graph of the same work
removes that. Choices made here, and why:

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

Memory. All graphs share one memory pool (``torch.cuda.graph_pool_handle()``). Every graph keeps its static
input and output alive for its lifetime and only its intermediates are freed back to the pool, and replays
are serialized on one stream, so the graphs may replay in any order. ``capture_all()`` captures the largest
graphs first (images, then text, largest batch and length first), so the pool is sized by the largest
graph's intermediates and smaller captures reuse it. ``max_graphs`` bounds how many graphs an encoder holds
(new input shapes or dtypes past it run eager). ``stats()`` reports capture time per graph, the pool's
segments (exact, from the allocator's snapshot of that pool) plus the static inputs, and the
``memory_allocated``/``memory_reserved`` deltas measured around each capture.

Server safety. One lock around staleness check, copy-in, replay and copy-out. The work runs on the
encoder's own CUDA stream, which first waits on the caller's current stream; the caller's stream then waits
on it, so callers on any stream see finished results and cannot race each other. Inputs are copied into the
graph's static buffer; outputs are copied into a fresh tensor allocated on the caller's stream, so a caller
never holds a buffer that a later call overwrites. Captures are serialized process-wide and run in
``thread_local`` capture mode, so eager CUDA work in other threads cannot invalidate them; still, calling
``capture_all()`` before serving keeps capture cost off the request path.

Never replay stale. At setup the encoder records, per tower, every parameter and buffer tensor object and its
``data_ptr``, and keeps an alias of each one's storage alive. ``.to()``, ``.half()``, ``.cuda()`` and
``.data = ...`` all put new storage under the parameter; since the old storage cannot be freed while pinned,
the new one can never sit at the old address, so one ``data_ptr`` comparison per tensor detects every move,
dtype change or data swap (in-place updates such as ``load_state_dict`` keep the storage: graphs read them
correctly and nothing is invalidated). A parameter, buffer or submodule reassigned on a module of the model
(``module.weight = nn.Parameter(...)``, ``load_state_dict(assign=True)``) is caught by PyTorch's global
registration hooks. ``clip_flash.patch``/``unpatch`` is caught by the identity of the patch report. On any of
these the encoder drops every graph, returns the pool's memory (``torch.cuda.empty_cache()``: a private pool
is only handed back to the device that way) and captures again lazily, for the model as it now is (eager, with
the reason logged, if the model went to the CPU). A model in training mode (root or tower root) raises
``RuntimeError``: the encoder encodes for inference; ``model.eval()`` makes it usable again. The check costs
one C call per tensor of the tower being encoded (ViT-L-14 image tower: 296 tensors; see the tests).
The pinned storage means a converted model's old weights stay allocated until the next call or
``release()``. Not detected: ``del`` of a parameter, writes to ``module._parameters`` directly, class swaps
other than clip_flash's own, and changes made while a call is running (a race in the caller's code).

Eager fallback, with the reason logged once per reason (logger ``clip_flash.cuda_graphs``): a model not on a
CUDA device, autocast enabled by the caller (graphs hold the model's own dtypes), an input shape the text
graphs do not cover, and a capture that fails (a tower or backend that syncs the host, for instance): that
key then runs eager for the encoder's lifetime. A failed capture's bookkeeping in PyTorch's device allocator is
cleaned up (``_cuda_endAllocateToPool``/``_cuda_releasePool``); the pinned-host allocator's cannot be from Python,
so later captures go to a new pool while earlier graphs keep replaying from theirs. Inputs the model
cannot take raise ``ValueError`` before any work: an input on another device than the model (CPU inputs are
copied to the model's device), images not in the vision tower's dtype (autocast off), token ids that are not
integers. Other errors of the model itself surface from the warm-up exactly as eager would raise them.

Results are inference tensors (every call runs under ``torch.inference_mode()``), on the model's device.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .patching import patch_report
from .text_fast_path import FlashTextCLIP, FlashTextTransformer, TextPlan, encode_pooled_text, pooled_positions

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_TEXT_LENGTHS = (8, 16, 24, 32, 48, 64, 77)
DEFAULT_MAX_GRAPHS = 64
# The PyTorch CUDA-graph docs warm up a few iterations on a side stream before capturing: lazy initialization
# (cuBLAS handles and workspaces, cuDNN plans, Triton compilation and autotuning) must not happen in capture.
DEFAULT_WARMUP_ITERS = 3

_data_ptr = torch.Tensor.data_ptr
# CUDA allows one capture at a time per process in practice (torch.cuda.graph shares one default capture
# stream, and capture_begin/end drive shared allocator state); encoders of different models share this lock.
_CAPTURE_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------------------------
# Staleness: what a tower's graphs depend on
# ---------------------------------------------------------------------------------------------------------------

_watch_lock = threading.Lock()
_live_watches: "weakref.WeakSet[TowerWatch]" = weakref.WeakSet()
_hooks_installed = False


def _note_reassignment(module: nn.Module, name: str, value: object) -> None:
    """Global registration hook (parameters, buffers, submodules): marks the watches of ``module`` stale."""
    if not _live_watches:  # every module in the process pays this call; keep it one test when nothing is watched
        return None
    with _watch_lock:
        watches = list(_live_watches)
    key = id(module)
    for watch in watches:
        if (key in watch.module_ids and (key, name) not in watch.excluded) or (key, name) in watch.links:
            watch.reassigned = f"{type(module).__name__}.{name}"
    return None


def _install_hooks() -> None:
    global _hooks_installed
    with _watch_lock:
        if _hooks_installed:
            return
        from torch.nn.modules import module as module_mod
        module_mod.register_module_parameter_registration_hook(_note_reassignment)
        module_mod.register_module_buffer_registration_hook(_note_reassignment)
        module_mod.register_module_module_registration_hook(_note_reassignment)
        _hooks_installed = True


class TowerWatch:
    """What one tower's graphs read, and a cheap test, run on every call, that none of it changed.

    Args:
        model: the whole model (its patch report and ``training`` flag are watched).
        roots: the tower's top modules (``model.visual``; ``model`` / ``model.text``): their ``training`` flags
            and patch reports are watched.
        tensors: every parameter and buffer the tower's graphs read.
        modules: every module whose parameter, buffer or submodule reassignment invalidates the tower.
        links: (parent module, attribute) pairs whose reassignment replaces the tower (``(model, "visual")``).
        excluded: (module, attribute) pairs of ``modules`` that belong to another tower.
    """

    def __init__(self, model: nn.Module, roots: Sequence[nn.Module], tensors: Sequence[torch.Tensor],
                 modules: Iterable[nn.Module], links: Iterable[Tuple[nn.Module, str]] = (),
                 excluded: Iterable[Tuple[nn.Module, str]] = ()):
        modules = list(modules)
        _install_hooks()
        self.roots = tuple(dict.fromkeys([model, *roots]))  # ordered, without duplicates
        self.tensors = tuple(tensors)
        self.pointers = tuple(map(_data_ptr, self.tensors))
        # Aliases keep the watched storages allocated, so replaced storage can never reuse a watched address.
        self._pins: Optional[List[torch.Tensor]] = [t.detach() for t in self.tensors]
        self.reports = tuple(patch_report(m) for m in self.roots)
        # Where each tensor is registered: only read when conversions replace parameter objects (below).
        watched = {id(t) for t in self.tensors}
        self._slots = [(slots, name, tensor) for module in modules for slots in (module._parameters, module._buffers)
                       for name, tensor in slots.items() if id(tensor) in watched]
        self.module_ids = frozenset(id(m) for m in modules)
        self.links = frozenset((id(m), name) for m, name in links)
        self.excluded = frozenset((id(m), name) for m, name in excluded)
        self.reassigned: Optional[str] = None
        with _watch_lock:
            _live_watches.add(self)

    @property
    def training(self) -> bool:
        return any(m.training for m in self.roots)

    def stale_reason(self) -> Optional[str]:
        """None while everything the graphs read is as it was at setup; otherwise what changed."""
        if self.reassigned is not None:
            return f"{self.reassigned} was reassigned"
        for module, report in zip(self.roots, self.reports):
            if patch_report(module) is not report:
                return "the clip_flash patch state changed"
        if tuple(map(_data_ptr, self.tensors)) != self.pointers:
            return "parameters or buffers were moved, converted or replaced (.to(), .half(), .data = ...)"
        # With this (non-default) flag .to()/.half() put new Parameter objects straight into module._parameters,
        # which neither moves the old objects' storage nor fires the registration hooks.
        if torch.__future__.get_overwrite_module_params_on_conversion() and \
                not all(slots.get(name) is tensor for slots, name, tensor in self._slots):
            return "parameters were replaced by a conversion (overwrite_module_params_on_conversion)"
        return None

    def close(self) -> None:
        """Stop watching and release the pinned storages."""
        with _watch_lock:
            _live_watches.discard(self)
        self._pins = None


def _tensors_of(module: nn.Module) -> List[torch.Tensor]:
    return list(module.parameters()) + list(module.buffers())


def _tower_watches(model: nn.Module) -> Tuple[TowerWatch, TowerWatch]:
    """(image watch, text watch): the vision tower is ``model.visual``; the text tower is everything else."""
    visual = getattr(model, "visual", None)
    if not isinstance(visual, nn.Module):
        everything = _tensors_of(model)
        modules = list(model.modules())
        return (TowerWatch(model, [], everything, modules), TowerWatch(model, [], everything, modules))
    visual_tensors = _tensors_of(visual)
    visual_ids = {id(t) for t in visual_tensors}
    visual_modules = {id(m) for m in visual.modules()}
    text_tensors = [t for t in _tensors_of(model) if id(t) not in visual_ids]
    text_modules = [m for m in model.modules() if id(m) not in visual_modules]
    text_root = getattr(model, "text", None)
    if not isinstance(text_root, nn.Module):
        text_root = getattr(model, "transformer", None)
    text_roots = [text_root] if isinstance(text_root, nn.Module) else []
    return (TowerWatch(model, [visual], visual_tensors, visual.modules(), links=[(model, "visual")]),
            TowerWatch(model, text_roots, text_tensors, text_modules, excluded=[(model, "visual")]))


# ---------------------------------------------------------------------------------------------------------------
# The encoder
# ---------------------------------------------------------------------------------------------------------------

# ("image", batch bucket, per-row shape, dtype) or ("text", batch bucket, computed length, token width, dtype)
GraphKey = Tuple[object, ...]


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    static_input: torch.Tensor
    static_output: torch.Tensor
    seconds: float


@dataclass
class _Setup:
    """Everything derived from the model at one point in time; replaced whole when the model changes."""

    device: torch.device
    watches: Dict[str, TowerWatch]
    no_graphs: Dict[str, Optional[str]]  # per tower: why it cannot be graphed (None: it can)
    image_dtype: Optional[torch.dtype]
    text_tower: Optional[nn.Module]  # set when the text tower skips padding: graphs run encode_pooled_text
    text_plan: Optional[TextPlan]
    context_length: Optional[int]
    length_for: Tuple[Optional[int], ...]  # longest pooled position + 1 -> length bucket
    stream: Optional["torch.cuda.Stream"] = None
    pool: Optional[Tuple[int, int]] = None  # where the next capture goes
    retired_pools: List[Tuple[int, int]] = field(default_factory=list)  # pools a failed capture left unusable
    graphs: Dict[GraphKey, Union[_Captured, str]] = field(default_factory=dict)  # str: why capture failed
    reserved_delta: int = 0  # torch.cuda.memory_reserved delta summed over this setup's captures

    def pools(self) -> List[Tuple[int, int]]:
        """Every pool this setup's graphs live in: the current one and any retired by a failed capture."""
        return self.retired_pools + ([self.pool] if self.pool is not None else [])


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


def _describe(key: GraphKey) -> str:
    if key[0] == "image":
        _, batch, shape, dtype = key
        return f"image b{batch} {'x'.join(map(str, shape))} {str(dtype).replace('torch.', '')}"
    _, batch, length, width, dtype = key
    return f"text b{batch} L{length}/{width} {str(dtype).replace('torch.', '')}"


def _bucket_table(buckets: Sequence[int]) -> Tuple[Optional[int], ...]:
    """table[n] = smallest bucket >= n, for n in 0..max(buckets); table[0] is None (an empty batch runs eager)."""
    table: List[Optional[int]] = [None]
    for n in range(1, max(buckets) + 1):
        table.append(min(b for b in buckets if b >= n))
    return tuple(table)


def _validated(sizes: Sequence[int], what: str) -> Tuple[int, ...]:
    values = tuple(sorted({int(s) for s in sizes}))
    if not values or values[0] < 1 or any(int(s) != s for s in sizes):
        raise ValueError(f"{what} must be positive integers, got {tuple(sizes)!r}")
    return values


def _first_conv_dtype(visual: nn.Module) -> Optional[torch.dtype]:
    """The dtype images must have: the first convolution's (OpenCLIP keeps some fp32 embeddings in fp16 models)."""
    for module in visual.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return module.weight.dtype
    param = next((p for p in visual.parameters() if p.is_floating_point()), None)
    return param.dtype if param is not None else None


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
        self.batch_sizes = _validated(batch_sizes, "batch_sizes")
        self.text_lengths = _validated(text_lengths, "text_lengths")
        if max_graphs < 1 or warmup_iters < 1:
            raise ValueError("max_graphs and warmup_iters must be at least 1")
        self.max_graphs = max_graphs
        self.warmup_iters = warmup_iters
        self._batch_for = _bucket_table(self.batch_sizes)
        self._lock = threading.Lock()
        self._logged_lock = threading.Lock()
        self._logged: set = set()
        self._setup: Optional[_Setup] = None
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
                if type(entry) is _Captured:
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
                if type(entry) is _Captured:
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
                keys += [("image", b, torch.Size(shape), dtype) for b in reversed(self.batch_sizes)]
            if setup.no_graphs["text"] is None and hasattr(self.model, "encode_text"):
                width = setup.context_length
                if width is None:
                    raise ValueError("the model has no context_length: capture text lazily, from encode_text calls")
                lengths = sorted({setup.length_for[n] for n in range(1, width + 1)}, reverse=True) \
                    if setup.text_plan is not None else [width]
                keys += [("text", b, length, width, token_dtype)
                         for b in reversed(self.batch_sizes) for length in lengths]
            for name, reason in setup.no_graphs.items():
                if reason is not None:
                    self._log_once(logging.WARNING, f"{name} tower runs eager: {reason}")
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
    def _fresh_setup(self, tower: str) -> _Setup:
        """The current setup, rebuilt first if the model changed since it was made (caller holds the lock)."""
        setup = self._setup
        if setup is None:
            setup = self._setup = self._build_setup()
        watch = setup.watches[tower]
        if watch.training:
            raise RuntimeError("GraphedEncoder encodes for inference, but the model is in training mode: "
                               "call model.eval() first")
        reason = watch.stale_reason()
        if reason is not None:
            logger.info("GraphedEncoder: %s tower changed (%s): dropping %d graph(s), capturing again as needed",
                        tower, reason, sum(type(e) is _Captured for e in setup.graphs.values()))
            self._invalidations += 1
            self._drop(setup)
            setup = self._setup = self._build_setup()
        return setup

    def _build_setup(self) -> _Setup:
        model = self.model
        image_watch, text_watch = _tower_watches(model)
        watches = {"image": image_watch, "text": text_watch}
        first = next(iter(image_watch.tensors or text_watch.tensors), None)
        device = first.device if first is not None else torch.device("cpu")
        no_graphs: Dict[str, Optional[str]] = {}
        for name, watch in watches.items():
            devices = {t.device for t in watch.tensors}
            if device.type != "cuda":
                no_graphs[name] = f"the model is on {device.type}: CUDA graphs need a CUDA model"
            elif devices - {device}:
                no_graphs[name] = f"the {name} tower spans devices {sorted(map(str, devices | {device}))}"
            else:
                no_graphs[name] = None

        text_tower, plan = None, None
        for candidate in (model, getattr(model, "text", None)):
            if isinstance(candidate, (FlashTextCLIP, FlashTextTransformer)) and \
                    "_clip_flash_text" in candidate.__dict__:
                text_tower, plan = candidate, candidate._clip_flash_text
                break
        if text_tower is not None:
            context_length = int(text_tower.positional_embedding.shape[0])
        else:
            context_length = getattr(model, "context_length", None) or getattr(
                getattr(model, "text", None), "context_length", None)
        length_for: Tuple[Optional[int], ...] = ()
        if context_length:
            lengths = [length for length in self.text_lengths if length < context_length] + [context_length]
            length_for = _bucket_table(lengths)

        visual = getattr(model, "visual", None)
        setup = _Setup(
            device=device, watches=watches, no_graphs=no_graphs,
            image_dtype=_first_conv_dtype(visual) if isinstance(visual, nn.Module) else None,
            text_tower=text_tower, text_plan=plan, context_length=context_length, length_for=length_for,
        )
        if any(reason is None for reason in no_graphs.values()):
            # One stream per device for the encoder's lifetime: PyTorch keeps a cuBLAS workspace per stream, for
            # good, so a new stream per setup would leave one behind at every invalidation.
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device)
            setup.stream = stream
            setup.pool = torch.cuda.graph_pool_handle()  # a fresh pool: the previous one was freed with its graphs
        return setup

    def _drop(self, setup: _Setup) -> None:
        """Free a setup's graphs and pool (caller holds the lock)."""
        for watch in setup.watches.values():
            watch.close()
        had_graphs = any(type(e) is _Captured for e in setup.graphs.values())
        if setup.stream is not None:
            # A replay may still be running on the stream and reading the static buffers about to be freed.
            setup.stream.synchronize()
        setup.graphs.clear()
        if had_graphs:
            # With its graphs gone the private pool is only marked freeable; empty_cache returns it to the device.
            torch.cuda.empty_cache()

    # -- choosing the graph -------------------------------------------------------------------------------------
    @staticmethod
    def _check_input(setup: _Setup, tower: str, x: torch.Tensor) -> None:
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

    def _usable_input(self, setup: _Setup, tower: str, x: torch.Tensor) -> Optional[str]:
        """Why ``x`` cannot go through a graph of this setup (None: it can)."""
        reason = setup.no_graphs[tower]
        if reason is not None:
            return reason
        if torch.is_autocast_enabled("cuda"):
            return "autocast is enabled: the graphs compute in the model's own dtypes"
        return None

    def _image_entry(self, setup: _Setup, images: torch.Tensor, n: int) -> Union[_Captured, str]:
        reason = self._usable_input(setup, "image", images)
        if reason is not None:
            return reason
        bucket = self.batch_bucket(n)
        if bucket is None:
            return f"batch size outside 1..{self.batch_sizes[-1]} (the largest bucket)"
        return self._entry(setup, ("image", bucket, images.shape[1:], images.dtype))

    def _length_of(self, setup: _Setup, tokens: torch.Tensor) -> int:
        if setup.text_plan is None or tokens.dim() != 2 or tokens.shape[1] != setup.context_length \
                or tokens.shape[0] == 0:
            return tokens.shape[-1]
        plan = setup.text_plan
        longest = int(pooled_positions(tokens, plan.pool_type, plan.eos_id).max()) + 1
        return setup.length_for[longest]

    def _text_entry(self, setup: _Setup, tokens: torch.Tensor, n: int, length: int) -> Union[_Captured, str]:
        reason = self._usable_input(setup, "text", tokens)
        if reason is not None:
            return reason
        if tokens.dim() != 2 or (setup.text_plan is not None and tokens.shape[1] != setup.context_length):
            return f"token shape {tuple(tokens.shape)} is not (batch, {setup.context_length})"
        bucket = self.batch_bucket(n)
        if bucket is None:
            return f"batch size outside 1..{self.batch_sizes[-1]} (the largest bucket)"
        return self._entry(setup, ("text", bucket, length, tokens.shape[1], tokens.dtype))

    def _entry(self, setup: _Setup, key: GraphKey) -> Union[_Captured, str]:
        entry = setup.graphs.get(key)
        if entry is not None:
            return entry
        if len(setup.graphs) >= self.max_graphs:
            return f"max_graphs={self.max_graphs} graphs held already"
        return self._capture(setup, key)

    # -- capture, replay, eager ---------------------------------------------------------------------------------
    def _graphed_function(self, setup: _Setup, key: GraphKey) -> Tuple[Tuple[int, ...], Callable]:
        """(static input shape, function of the static input) for a graph key."""
        if key[0] == "image":
            _, batch, shape, _ = key
            return (batch, *shape), self.model.encode_image
        _, batch, length, width, _ = key
        if setup.text_plan is not None:
            tower, plan = setup.text_tower, setup.text_plan
            # With cut_length the padding-skipping path never reads device values on the host: capturable.
            return (batch, width), lambda tokens: encode_pooled_text(tower, tokens, plan, cut_length=length)
        return (batch, width), self.model.encode_text

    def _capture(self, setup: _Setup, key: GraphKey) -> Union[_Captured, str]:
        """Warm up, then capture one graph into the shared pool (caller holds the lock, in inference mode).

        Errors from the warm-up are the model's own (eager would raise them too) and propagate; an error in the
        capture itself marks the key eager for this setup, with the reason logged.
        """
        shape, function = self._graphed_function(setup, key)
        device, stream = setup.device, setup.stream
        with _CAPTURE_LOCK, torch.cuda.device(device), torch.autocast("cuda", enabled=False):
            started = time.perf_counter()
            static_input = torch.zeros(shape, dtype=key[-1], device=device)
            caller = torch.cuda.current_stream(device)
            stream.wait_stream(caller)
            with torch.cuda.stream(stream):
                for _ in range(self.warmup_iters):
                    function(static_input)
            allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
            graph = torch.cuda.CUDAGraph()
            try:
                # The outer stream context restores the caller's stream even when capture_end raises, which
                # torch.cuda.graph's own __exit__ then skips.
                with torch.cuda.stream(stream):
                    with torch.cuda.graph(graph, pool=setup.pool, stream=stream, capture_error_mode="thread_local"):
                        static_output = function(static_input)
                if not isinstance(static_output, torch.Tensor):
                    raise TypeError(f"the captured function returned {type(static_output).__name__}, not a tensor")
            except Exception as error:  # noqa: BLE001 - any capture failure means: run this key eager
                if not _recover_failed_capture(graph, device, setup.pool):
                    # Graphs already captured keep replaying from the old pool; later captures use a new one.
                    setup.retired_pools.append(setup.pool)
                    setup.pool = torch.cuda.graph_pool_handle()
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                reason = f"CUDA-graph capture of {_describe(key)} failed ({type(error).__name__}: {message[:200]})"
                setup.graphs[key] = reason
                self._log_once(logging.WARNING, reason + "; it runs eager from now on")
                return reason
            caller.wait_stream(stream)
            self._allocated_delta += torch.cuda.memory_allocated(device) - allocated
            grown = torch.cuda.memory_reserved(device) - reserved
            self._reserved_delta += grown
            setup.reserved_delta += grown
            captured = _Captured(graph, static_input, static_output, time.perf_counter() - started)
        setup.graphs[key] = captured
        logger.debug("captured %s in %.3f s", _describe(key), captured.seconds)
        return captured

    def _replay(self, setup: _Setup, captured: _Captured, x: torch.Tensor, n: int, normalize: bool) -> torch.Tensor:
        """Copy in, replay, copy out on the encoder's stream (caller holds the lock, in inference mode)."""
        stream = setup.stream
        caller = torch.cuda.current_stream(setup.device)
        static_output = captured.static_output
        # Allocated on the caller's stream, which waits for the copy-out below before any later use or reuse.
        out = torch.empty((n, *static_output.shape[1:]), dtype=static_output.dtype, device=static_output.device)
        # Pageable host memory is staged by cudaMemcpyAsync before it returns, so the caller may reuse it at once;
        # pinned memory is read asynchronously, so copy it synchronously rather than race the caller's next write.
        non_blocking = x.device.type != "cpu" or not x.is_pinned()
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            captured.static_input[:n].copy_(x, non_blocking=non_blocking)
            captured.graph.replay()
            if normalize:
                F.normalize(static_output[:n], dim=-1, out=out)
            else:
                out.copy_(static_output[:n])
        caller.wait_stream(stream)
        self._replays += 1
        return out

    def _eager(self, setup: _Setup, encode: Callable, x: torch.Tensor, normalize: bool, reason: str) -> torch.Tensor:
        # Batches past the buckets are expected, and failed captures were already warned about when they failed.
        level = logging.INFO if reason.startswith("batch size") or "capture" in reason else logging.WARNING
        self._log_once(level, f"running eager: {reason}")
        with self._logged_lock:
            self._eager_calls += 1
        if x.device.type == "cpu" and setup.device.type != "cpu":
            x = x.to(setup.device, non_blocking=True)
        return encode(x, normalize=normalize)

    # -- reporting ----------------------------------------------------------------------------------------------
    def _log_once(self, level: int, message: str) -> None:
        with self._logged_lock:
            if message in self._logged:
                return
            self._logged.add(message)
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
        captured = {key: e for key, e in graphs.items() if type(e) is _Captured}
        memory = 0
        if captured:
            memory = sum(e.static_input.numel() * e.static_input.element_size() for e in captured.values())
            memory += sum(_pool_bytes(pool, self._reserved_delta) for pool in setup.pools())
        capture_seconds = {_describe(key): e.seconds for key, e in captured.items()}
        return GraphStats(
            graphs=len(captured),
            capture_seconds=capture_seconds,
            total_capture_seconds=sum(capture_seconds.values()),
            pool_memory_bytes=setup.reserved_delta if setup is not None else 0,
            failed_captures={_describe(key): e for key, e in graphs.items() if type(e) is str},
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


def _pool_bytes(pool: Optional[Tuple[int, int]], fallback: int) -> int:
    """Bytes of the private pool's segments, from the allocator's snapshot of that pool alone."""
    if pool is None:
        return 0
    try:
        segments = torch.cuda.memory_snapshot(mempool_id=pool, include_traces=False)
    except (RuntimeError, TypeError):  # an older PyTorch without per-pool snapshots
        return max(fallback, 0)
    return sum(segment["total_size"] for segment in segments)


def _recover_failed_capture(graph: "torch.cuda.CUDAGraph", device: torch.device, pool: Tuple[int, int]) -> bool:
    """Undo what a failed capture left in PyTorch's allocators; True when ``pool`` can take further captures.

    capture_begin routes the capture stream's device and pinned-host allocations to ``pool`` and takes a use of
    it; when the capture is invalidated (a host sync, say), capture_end raises before ending either routing and
    the graph never gives its use back. Left alone, the device allocator believes a capture is still underway
    (it then defers freeing memory used across streams) and the pool can never be freed. The device side can be
    undone from Python; the pinned-host allocator's routing cannot, and it refuses any later capture into the
    same pool ("beginAllocateToPool: already recording to mempool_id"), so such a pool is retired.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except RuntimeError:  # capture_end ended the routing itself
        try:
            graph.pool()
            return True  # the capture ended cleanly: dropping the graph object gives its use of the pool back
        except RuntimeError:  # ended the routing, then failed: the graph will not give its use back
            torch._C._cuda_releasePool(index, pool)
            return True
    torch._C._cuda_releasePool(index, pool)
    return False
