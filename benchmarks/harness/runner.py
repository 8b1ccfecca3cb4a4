"""Measure one OpenCLIP model stock vs patched: per-shape rows, zero-shot classifier, latency.

Stock and patched are two copies of the same weights in the same process: the loaded model stays
stock, a deep copy is patched with the public ``clip_flash.patch``. Keeping both resident (rather
than patching and unpatching one model) keeps both warm, so blocks of calls can alternate freely.
"""
from __future__ import annotations

import copy
import gc
import itertools
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

import clip_flash

from . import timing
from .image_pipelines import measure_bench_pipelines
from .records import TOWERS, BenchError, BenchSettings, ModelResult, ShapeResult  # noqa: F401 (re-exported)
from clip_flash.models.model_spec import LoadedModel, ModelSpec, fp32_reference, load_model
from .workloads import (
    caption_prompts,
    caption_token_ids,
    load_image_folder,
    random_images,
    random_token_ids,
    take_rows,
    zero_shot_prompts,
)

MIB = 1024 * 1024
# clip_flash's report names the image tower "vision".
REPORT_TOWER = {"text": "text", "image": "vision"}
LATENCY_INPUT_POOL = 8  # distinct single requests cycled through in --latency mode


def _cosine_stats(output: torch.Tensor, reference: torch.Tensor) -> Tuple[float, float]:
    """Mean and minimum cosine similarity of matching rows."""
    cosine = F.cosine_similarity(output.float(), reference.float(), dim=-1)
    return cosine.mean().item(), cosine.min().item()


def _mib(size: Optional[int]) -> Optional[float]:
    return None if size is None else size / MIB


class ModelBench:
    """A loaded model with its stock copy, patched copy and fp32 reference, ready to measure."""

    def __init__(self, spec: ModelSpec, settings: BenchSettings) -> None:
        self.settings = settings
        self.device = settings.device
        self.loaded: LoadedModel = load_model(spec, settings.device, settings.precision, settings.seed)
        self.stock = self.loaded.model
        self.patched = copy.deepcopy(self.stock)
        try:
            self.report = clip_flash.patch(self.patched, backend=settings.backend, **settings.patch_options)
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as error:
            options = "".join(f", {key}={value!r}" for key, value in settings.patch_options.items())
            raise BenchError(
                f"error: clip_flash.patch(model, backend={settings.backend!r}{options}) failed for "
                f"{spec.text}: {error}"
            ) from None
        self.reference = fp32_reference(self.loaded)
        self.stock_image, self.stock_text = self.stock.encode_image, self.stock.encode_text
        if settings.baseline != "stock":
            # Compiled lazily, per shape, by the first (warm-up) call: the cost never enters the timings.
            mode = settings.baseline.split(":", 1)[1]
            self.stock_image = torch.compile(self.stock.encode_image, mode=mode)
            self.stock_text = torch.compile(self.stock.encode_text, mode=mode)
        self.graphed = None
        if settings.cuda_graphs:
            # Captured up front (as a server would at startup); replays serve the patched side.
            buckets = {} if settings.graph_batch_sizes is None else {"batch_sizes": settings.graph_batch_sizes}
            self.graphed = clip_flash.GraphedEncoder(self.patched, **buckets)
            self.graphed.capture_all(image_shape=(3, *self.loaded.image_size), image_dtype=self.loaded.dtype)
        self._image_pool: Optional[torch.Tensor] = None
        self.skipped_images: List[str] = []
        self._tokenizer = None
        self._patched_tokenizer = None

    # ----- inputs -------------------------------------------------------------------------
    def tokenizer(self) -> Callable:
        """The model's own tokenizer, built once."""
        if self._tokenizer is None:
            self._tokenizer = self.loaded.tokenizer()
        return self._tokenizer

    def patched_tokenizer(self) -> Callable:
        """The patched side's tokenizer (``settings.text_tokenizer``), built once."""
        if self._patched_tokenizer is None:
            if self.settings.text_tokenizer == "openclip":
                self._patched_tokenizer = self.tokenizer()
            else:
                self._patched_tokenizer = clip_flash.get_tokenizer(self.loaded.spec.name)
        return self._patched_tokenizer

    def tokenizer_names(self) -> Dict[str, str]:
        """What tokenizes on each side, for the results."""
        from clip_flash.inputs.text.tokenizer import describe_tokenizer
        return {"stock_tokenizer": describe_tokenizer(self.tokenizer()),
                "patched_tokenizer": describe_tokenizer(self.patched_tokenizer()).split("; texts so far")[0]}

    def text_inputs(self, batch: int, seed_offset: int = 0) -> torch.Tensor:
        """Token ids of ``batch`` rows on the device, per ``--text-input``."""
        seed = self.settings.seed + seed_offset
        if self.settings.text_input in ("captions", "caption-ids"):
            tokens = caption_token_ids(self.tokenizer(), batch, seed)
        else:
            tokens = random_token_ids(batch, self.loaded.context_length, self.loaded.vocab_size, seed)
        return tokens.to(self.device)

    def image_inputs(self, batch: int, seed_offset: int = 0) -> torch.Tensor:
        """``batch`` images in fp32 on the device (cast to the model dtype by the caller)."""
        if self.settings.images_dir is not None:
            if self._image_pool is None:
                limit = max(max(self.settings.batch_sizes, default=1), LATENCY_INPUT_POOL)
                self._image_pool, self.skipped_images = load_image_folder(
                    self.settings.images_dir, self.loaded.preprocess, limit)
            pool = self._image_pool
            if seed_offset:
                pool = pool.roll(-seed_offset, dims=0)
            return take_rows(pool, batch).to(self.device)
        return random_images(batch, self.loaded.image_size, self.settings.seed + seed_offset).to(self.device)

    def encoders(self, tower: str, batch: int, seed_offset: int = 0) -> Tuple[Callable, Callable, Callable]:
        """Zero-argument stock, patched and fp32-reference calls on the same inputs."""
        if tower == "text":
            tokens = self.text_inputs(batch, seed_offset)
            patched_text = self.graphed.encode_text if self.graphed is not None else self.patched.encode_text
            if self.settings.text_input == "captions":
                # Strings to embeddings: each side tokenizes with its own tokenizer, then encodes.
                captions = caption_prompts(batch, self.settings.seed + seed_offset)
                stock_tokenizer, patched_tokenizer = self.tokenizer(), self.patched_tokenizer()
                return (
                    lambda: self.stock_text(stock_tokenizer(captions).to(self.device)),
                    lambda: patched_text(patched_tokenizer(captions).to(self.device)),
                    lambda: self.reference.encode_text(tokens),
                )
            return (
                lambda: self.stock_text(tokens),
                lambda: patched_text(tokens),
                lambda: self.reference.encode_text(tokens),
            )
        images_fp32 = self.image_inputs(batch, seed_offset)
        # The model dtype's images, and exactly those values in fp32 for the reference.
        images = images_fp32.to(self.loaded.dtype)
        images_reference = images.float()
        patched_image = self.graphed.encode_image if self.graphed is not None else self.patched.encode_image
        return (
            lambda: self.stock_image(images),
            lambda: patched_image(images),
            lambda: self.reference.encode_image(images_reference),
        )

    def shape_of(self, tower: str, batch: int) -> Tuple[int, ...]:
        """The input shape of one call."""
        if tower == "text":
            return (batch, self.loaded.context_length)
        return (batch, 3, *self.loaded.image_size)

    def backend_for(self, tower: str) -> str:
        """The backend(s) clip_flash reports for a tower."""
        names = self.report.backends_used().get(REPORT_TOWER[tower]) or []
        return "+".join(names) if names else "stock (not patched)"

    # ----- measurements -------------------------------------------------------------------
    def measure_shape(self, tower: str, batch: int) -> ShapeResult:
        """One row: warm up, compare outputs and peak memory, then time alternating blocks."""
        settings = self.settings
        stock, patched, reference = self.encoders(tower, batch)
        with torch.inference_mode():
            # The last warm-up call of each side is also the one whose output and memory we keep.
            timing.warm_up(stock, patched, settings.warmup - 1, self.device)
            stock_out, stock_peak = timing.call_with_peak_memory(stock, self.device)
            patched_out, patched_peak = timing.call_with_peak_memory(patched, self.device)
            reference_out = stock_out if self.reference is self.stock else reference()
            # Compare before timing: a patched model may return a buffer that later calls reuse
            # (e.g. a CUDA graph's static output).
            stock_cos, stock_min_cos = _cosine_stats(stock_out, reference_out)
            patched_cos, patched_min_cos = _cosine_stats(patched_out, reference_out)
            mean_abs_diff = (stock_out.float() - patched_out.float()).abs().mean().item()
            measured = timing.time_alternating(stock, patched, settings.times, self.device)
        return ShapeResult(
            model=self.loaded.spec.text,
            tower=tower,
            batch=batch,
            shape=self.shape_of(tower, batch),
            times=settings.times,
            stock_total_s=measured.stock_total,
            patched_total_s=measured.patched_total,
            speedup=measured.stock_total / measured.patched_total,
            mean_abs_diff=mean_abs_diff,
            stock_median_ms=measured.stock_median * 1e3,
            patched_median_ms=measured.patched_median * 1e3,
            stock_items_per_s=batch / measured.stock_median,
            patched_items_per_s=batch / measured.patched_median,
            stock_peak_mib=_mib(stock_peak),
            patched_peak_mib=_mib(patched_peak),
            stock_cos_fp32=stock_cos,
            patched_cos_fp32=patched_cos,
            stock_min_cos_fp32=stock_min_cos,
            patched_min_cos_fp32=patched_min_cos,
            backend=self.backend_for(tower),
        )

    def zero_shot_classifier(self) -> Dict[str, Any]:
        """Time building an ImageNet zero-shot classifier (classes x templates prompts) both ways.

        From strings: each build tokenizes the prompts with its side's tokenizer (OpenCLIP's for stock,
        ``settings.text_tokenizer`` for patched), then encodes them batch by batch.
        """
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

        settings = self.settings
        classes = list(IMAGENET_CLASSNAMES[: settings.zero_shot_classes])
        templates = list(OPENAI_IMAGENET_TEMPLATES[: settings.zero_shot_templates])
        prompts = zero_shot_prompts(classes, templates)
        tokenizers = {"stock": self.tokenizer(), "patched": self.patched_tokenizer()}
        tokenize_seconds: Dict[str, List[float]] = {"stock": [], "patched": []}
        first = tokenizers["stock"](prompts[: settings.zero_shot_batch]).to(self.device)

        def build(model: torch.nn.Module, side: str) -> torch.Tensor:
            started = time.perf_counter()  # tokenizing is CPU work that ends before any GPU work is queued
            tokens = tokenizers[side](prompts)
            tokenize_seconds[side].append(time.perf_counter() - started)
            chunks = tokens.to(self.device).split(settings.zero_shot_batch)
            embeddings = torch.cat([model.encode_text(chunk) for chunk in chunks]).float()
            per_class = F.normalize(embeddings, dim=-1).view(len(classes), len(templates), -1).mean(dim=1)
            return F.normalize(per_class, dim=-1)

        models = {"stock": self.stock, "patched": self.patched}
        seconds: Dict[str, List[float]] = {"stock": [], "patched": []}
        classifiers: Dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            timing.warm_up(lambda: self.stock.encode_text(first), lambda: self.patched.encode_text(first),
                           settings.warmup, self.device)
            for side in tokenizers:  # one untimed call each: a tokenizer's first call fills its caches
                tokenizers[side](prompts[: settings.zero_shot_batch])
            for repeat in range(settings.zero_shot_repeats):
                for side in ("stock", "patched") if repeat % 2 == 0 else ("patched", "stock"):
                    classifiers[side], elapsed = timing.timed_call(lambda: build(models[side], side), self.device)
                    seconds[side].append(elapsed)
            reference = classifiers["stock"] if self.reference is self.stock else build(self.reference, "stock")
        stock_classifier, patched_classifier = classifiers["stock"], classifiers["patched"]
        stock_seconds, patched_seconds = seconds["stock"], seconds["patched"]
        stock_s = timing.percentile(stock_seconds, 50)
        patched_s = timing.percentile(patched_seconds, 50)
        prompt_count = len(prompts)
        return {
            "classes": len(classes),
            "templates": len(templates),
            "prompts": prompt_count,
            "batch": settings.zero_shot_batch,
            "repeats": settings.zero_shot_repeats,
            "stock_seconds": stock_seconds,
            "patched_seconds": patched_seconds,
            "stock_median_s": stock_s,
            "patched_median_s": patched_s,
            "speedup": stock_s / patched_s,
            "stock_prompts_per_s": prompt_count / stock_s,
            "patched_prompts_per_s": prompt_count / patched_s,
            "stock_tokenize_median_s": timing.percentile(tokenize_seconds["stock"][:len(stock_seconds)], 50),
            "patched_tokenize_median_s": timing.percentile(tokenize_seconds["patched"], 50),
            **self.tokenizer_names(),
            "stock_cos_fp32": _cosine_stats(stock_classifier, reference)[0],
            "patched_cos_fp32": _cosine_stats(patched_classifier, reference)[0],
            "max_abs_diff": (stock_classifier - patched_classifier).abs().max().item(),
            "backend": self.backend_for("text"),
        }

    def latency(self) -> Dict[str, Any]:
        """Closed loop of single requests (batch 1) per tower: p50/p99 both ways."""
        settings = self.settings
        results: Dict[str, Any] = {}
        for tower in settings.towers:
            requests = [self.encoders(tower, 1, seed_offset=index) for index in range(LATENCY_INPUT_POOL)]
            # Each side walks the same sequence of distinct inputs.
            stock_cycle = itertools.cycle([stock for stock, _, _ in requests])
            patched_cycle = itertools.cycle([patched for _, patched, _ in requests])
            stock = lambda: next(stock_cycle)()  # noqa: E731 - a closure over the cycle
            patched = lambda: next(patched_cycle)()  # noqa: E731
            with torch.inference_mode():
                timing.warm_up(stock, patched, settings.warmup, self.device)
                measured = timing.latency_closed_loop(stock, patched, settings.latency_requests, self.device)
            stock_p50 = timing.percentile(measured.stock_seconds, 50)
            patched_p50 = timing.percentile(measured.patched_seconds, 50)
            results[tower] = {
                "requests": settings.latency_requests,
                "shape": list(self.shape_of(tower, 1)),
                "stock_p50_ms": stock_p50 * 1e3,
                "stock_p99_ms": timing.percentile(measured.stock_seconds, 99) * 1e3,
                "patched_p50_ms": patched_p50 * 1e3,
                "patched_p99_ms": timing.percentile(measured.patched_seconds, 99) * 1e3,
                "speedup_p50": stock_p50 / patched_p50,
                "backend": self.backend_for(tower),
            }
        if self.graphed is not None:
            stats = self.graphed.stats()
            results["cuda_graphs"] = {
                "graphs": stats.graphs,
                "capture_seconds": stats.total_capture_seconds,
                "graph_memory_mib": stats.graph_memory_bytes / 2**20,
                "reserved_delta_mib": stats.pool_memory_bytes / 2**20,
            }
        return results

    def close(self) -> None:
        """Drop the models and give their memory back before the next model."""
        self.stock = self.patched = self.reference = None
        self.loaded = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class RunObserver:
    """Hooks a caller overrides to show progress; every default does nothing."""

    def step(self, description: str) -> None:
        """Something slow is starting (loading a model, measuring a shape...)."""

    def model_started(self, result: ModelResult) -> None:
        """A model is loaded and patched; ``result`` has its description but no rows yet."""

    def row_done(self, result: ModelResult, row: ShapeResult) -> None:
        """A shape's row is measured (already appended to ``result.rows``)."""

    def unit_done(self) -> None:
        """One counted unit of work finished (a row, the zero-shot build, the latency loop)."""


def planned_shapes(settings: BenchSettings) -> List[Tuple[str, int]]:
    """(tower, batch) pairs in run order: all text batches, then all image batches."""
    if not settings.tables:
        return []
    return [(tower, batch) for tower in TOWERS if tower in settings.towers for batch in settings.batch_sizes]


def units_per_model(settings: BenchSettings) -> int:
    """How many :meth:`RunObserver.unit_done` calls one model makes (for a progress total)."""
    return (
        len(planned_shapes(settings))
        + (1 if settings.zero_shot_classes else 0)
        + (1 if settings.latency_requests else 0)
        + (1 if settings.pipelines else 0)
    )


def run_model(spec: ModelSpec, settings: BenchSettings, observer: Optional[RunObserver] = None) -> ModelResult:
    """Measure one model spec, telling ``observer`` about progress as it happens."""
    observer = observer or RunObserver()
    observer.step(f"loading {spec.text}")
    bench = ModelBench(spec, settings)
    try:
        loaded = bench.loaded
        result = ModelResult(
            spec=spec.text,
            name=spec.name,
            weights=spec.kind,
            weights_note=spec.weights_note,
            precision=settings.precision,
            image_size=loaded.image_size,
            context_length=loaded.context_length,
            text_input=settings.text_input,
            patch_report=bench.report.to_dict(),
            patch_report_text=str(bench.report),
            backends_used=bench.report.backends_used(),
        )
        observer.model_started(result)
        for tower, batch in planned_shapes(settings):
            observer.step(f"{spec.name} {tower} {bench.shape_of(tower, batch)}")
            row = bench.measure_shape(tower, batch)
            result.rows.append(row)
            observer.row_done(result, row)
            observer.unit_done()
        if settings.zero_shot_classes:
            observer.step(f"{spec.name} zero-shot classifier")
            result.zero_shot = bench.zero_shot_classifier()
            observer.unit_done()
        if settings.latency_requests:
            observer.step(f"{spec.name} latency")
            result.latency = bench.latency()
            observer.unit_done()
        if settings.pipelines:
            observer.step(f"{spec.name} image pipelines {' '.join(settings.pipelines)}")
            result.image_pipelines = measure_bench_pipelines(bench.patched, loaded, settings)
            observer.unit_done()
        result.skipped_images = bench.skipped_images
        return result
    finally:
        bench.close()
