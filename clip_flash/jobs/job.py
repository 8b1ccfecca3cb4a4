"""``clip_flash.embed``: one call from a folder, tar shards or a caption file to clip-retrieval's layout.

    import clip_flash
    summary = clip_flash.embed("photos/", "out/", model="ViT-L-14::laion2b_s32b_b82k")
    print(summary.format())

The job plans its shards, checks the output folder (refusing one whose finished shards were made with other
settings or from inputs that changed since), skips the shards an earlier run finished, loads and patches the
model, records its settings, runs the pipeline, and writes ``failures.parquet`` and a JSON record of the run.
:mod:`clip_flash.jobs.cli` is its command line.
"""
from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

from .beside_load import load_beside
from .beside_load_work import device_first_uses, feed_ahead, gpu_decoders_ahead, inputs_ahead, reserve_pinned_blocks
from .device_ahead import IMAGE_PATH_STEP
from .pinned_reserve import first_images
from .run_stats import PipelineStats
from ..environment import usable_cores
from .record import JobSummary, gpu_peak_mib, record_name, run_record, steady_rate
from .runner import OUTPUT_DTYPES, decoding_workers, make_runner
from .sources import Shard, Source, open_source
from .weights_identity import checkpoint_sha256
from .writer import OutputFolder

logger = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 10240          # 40 batches of 256: at most this many inputs are redone after a kill
DEFAULT_IMAGE_BATCH = 256
# A text batch's launches cost the host about as much at 1,024 captions as at 4,096 (the tower skips padding,
# so its GPU time follows the tokens): larger batches spread that host time over more captions.
DEFAULT_TEXT_BATCH = 4096
# A CPU embeds a few images (or a few hundred captions) per second: smaller batches let the progress bar move
# every few seconds instead of once a minute.
CPU_IMAGE_BATCH = 32
CPU_TEXT_BATCH = 256


def default_batch_size(has_images: bool, device_type: str) -> int:
    """The batch a job uses when none is given: 256 images / 4,096 captions on a GPU, 32 / 256 on a CPU."""
    if device_type == "cuda":
        return DEFAULT_IMAGE_BATCH if has_images else DEFAULT_TEXT_BATCH
    return CPU_IMAGE_BATCH if has_images else CPU_TEXT_BATCH


PIPELINES = ("clip_flash", "stock")
EXECUTORS = ("auto", "native", "thread")  # ImagePreprocessor's
DECODES = ("cpu", "gpu")
SETTINGS_VERSION = 2
CHECKPOINT_DIGESTS_FILE = "checkpoint_sha256.json"  # in the output's state folder: see weights_identity
RANDOM_INIT_WARNING = (
    "%s has RANDOM-INIT weights (no pretrained tag or checkpoint given): these embeddings are meaningless for "
    "search. For real embeddings pass --model %s::TAG (OpenCLIP's pretrained tags) or --model %s::/path/to/ckpt.")


def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    """The job's device: CUDA where there is one when ``device`` is None; ``ValueError`` for a CUDA device this
    machine does not have (before anything starts on it)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available here "
                             "(torch.cuda.is_available() is False); leave the device out to run on the CPU")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} asked for, but this machine has {torch.cuda.device_count()} "
                             "CUDA device(s)")
    return resolved


def job_settings(source: Source, plan: List[Shard], model: str, precision: str,
                 patch: bool, pipeline: str, decode: str, normalize: bool, out_dtype: str,
                 digest_cache: Optional[Path] = None) -> Dict[str, Any]:
    """Everything the embeddings depend on; a resumed job must match it exactly. A checkpoint is identified by
    the SHA-256 of its bytes (cached in ``digest_cache`` by path, size and modification time)."""
    from clip_flash.models import parse_model_spec

    spec = parse_model_spec(model)
    weights: Dict[str, Any] = {"kind": spec.kind, "weights": spec.weights}
    if spec.kind == "checkpoint" and os.path.isfile(spec.weights):
        weights["sha256"] = checkpoint_sha256(spec.weights, digest_cache)
    return {
        "settings_version": SETTINGS_VERSION,
        "model": spec.name,
        "weights": weights,
        "precision": precision,
        "patched": patch,
        "image_inputs": pipeline if source.has_images else None,
        "decode": decode if source.has_images else None,
        "normalize": normalize,
        "out_dtype": out_dtype,
        "source": source.settings(),
        "shards": len(plan),
    }


def shards_to_do(plan: List[Shard], output: OutputFolder) -> List[Shard]:
    """The shards no earlier run finished; clears whatever those left behind."""
    todo = [shard for shard in plan if not output.finished(shard.index, shard.fingerprint, shard.inputs)]
    for shard in todo:
        output.clear(shard.index)
    return todo


def _progress(total: Optional[int], enabled: bool):
    from tqdm.auto import tqdm

    # miniters=1: any batch may redraw the bar (tqdm otherwise adapts how many items it waits for between redraws)
    return tqdm(total=total, unit="item", dynamic_ncols=True, file=sys.stderr, miniters=1,
                disable=not enabled, desc="embedding", smoothing=0.1)


def embed(input: Union[str, Path], out: Union[str, Path], model: str = "ViT-B-32", *,
          device: Union[str, torch.device, None] = None, precision: Optional[str] = None, patch: bool = True,
          pipeline: str = "clip_flash", decode: str = "cpu", batch_size: Optional[int] = None,
          shard_size: int = DEFAULT_SHARD_SIZE, normalize: bool = True, out_dtype: str = "float16",
          captions: Optional[bool] = None, caption_column: Optional[str] = None, require_captions: bool = False,
          workers: Optional[int] = None, executor: str = "auto", cuda_graphs: bool = True,
          decode_threads: Optional[int] = None, exact_share: float = 0.0, repeat: int = 1,
          progress: bool = True, command: Optional[str] = None) -> JobSummary:
    """Embed a collection into ``out`` in clip-retrieval's layout; resume where an earlier run stopped.

    Args:
        input: a folder of images (recursive; ``x.txt`` beside ``x.jpg`` is its caption), WebDataset tar
            file(s) (a folder of them, or ``shards/{00000..00099}.tar``), or a ``.txt``/``.csv``/``.tsv``/
            ``.parquet`` file of captions (a text-only job: a blank caption or a null is a failure, ``empty
            caption``; rows keep the input's ``id`` column, or ``file:N``).
        out: the output folder (created; an earlier run's folder is resumed; one whose finished shards were made
            with other settings, other weights or from inputs that changed since is refused).
        model: ``NAME`` (random init, labelled so), ``NAME::TAG`` (OpenCLIP pretrained tag) or
            ``NAME::/path/to/checkpoint``.
        device: default CUDA when available, else CPU. precision: ``fp16``/``bf16``/``fp32``; default fp16
            on CUDA, fp32 on CPU (never changed silently: it is recorded in the settings).
        patch: run the model through ``clip_flash.patch`` (False: the stock model).
        pipeline: ``clip_flash`` (threaded decode + device preparation, fast tokenizer) or ``stock``
            (OpenCLIP's PIL preprocess in a DataLoader and its tokenizer: the baseline speed figure).
        decode: ``cpu`` (exact: Pillow's pixels) or ``gpu`` (nvJPEG; faster, not bit-exact).
        batch_size: default 256 for image jobs, 4096 for text-only (32 and 256 on a CPU).
        shard_size: inputs per output shard (folders and caption files; a WebDataset tar is one shard).
        normalize: L2-normalise the embeddings (clip-retrieval does). out_dtype: ``float16`` or ``float32``.
        captions: None reads captions where they exist (an image or sample without one gets an empty caption);
            False ignores them. caption_column: for CSV/parquet. require_captions: an image or sample without a
            caption is a failure (pairs only).
        workers: native decoding threads (default: the cores this process may use; stock: DataLoader
            workers = cores - 1).
        executor: ``auto`` (the native batch decoder where the extension is built, else Python threads),
            ``native`` or ``thread`` (see :class:`~clip_flash.inputs.image.preprocessor.ImagePreprocessor`).
        cuda_graphs: on CUDA, full image batches replay a captured CUDA graph of the image tower (the same
            kernels, so the same rows; it frees the main thread from launching them) where launching an eager
            batch takes ``warm_up.GRAPH_LAUNCH_SHARE`` of its time or more (measured on the run's second full
            batch; the run record's ``image_cuda_graphs`` says what ran); False runs them eager.
        decode_threads: batches prepared at once ahead of the GPU (default ``DEFAULT_DECODE_THREADS``, 2).
        exact_share: with ``decode="gpu"``, the share of each batch decoded exactly on the CPU beside nvJPEG's
            hardware decoder (those rows are exact; see :mod:`clip_flash.inputs.image.exact_share`, which says why
            it is 0 by default). Recorded in the run record.
        repeat: embed the input list this many times over (benchmarks on a small folder).
        progress: tqdm bar on stderr. command: recorded in the run record (default: this process's argv).

    Returns:
        A :class:`~clip_flash.jobs.record.JobSummary` (``.format()`` for the printed summary).

    Raises:
        SourceError, OutputError (including SettingsMismatchError, InputChangedError), ModelLoadError: with one
        clear message. The settings are recorded in ``out`` only once the model has loaded. ValueError: a setting
        out of range, or a CUDA device this machine does not have.
    """
    setup_started = time.perf_counter()
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if decode_threads is not None and decode_threads < 1:
        raise ValueError(f"decode_threads must be at least 1, got {decode_threads}")
    if not 0.0 <= exact_share <= 1.0:
        raise ValueError(f"exact_share must be from 0 to 1, got {exact_share}")
    device = resolve_device(device)
    job = plan_job(input, out, model, device_type=device.type, precision=precision, patch=patch, pipeline=pipeline,
                   decode=decode, shard_size=shard_size, normalize=normalize, out_dtype=out_dtype, captions=captions,
                   caption_column=caption_column, repeat=repeat, require_captions=require_captions)
    try:
        batch_size = batch_size or default_batch_size(job.source.has_images, device.type)
        stats = PipelineStats()
        setup_seconds = warm_up_seconds = model_load_seconds = None
        reserved = None  # page-locked blocks made while the model loaded (None: not asked for)
        decoders_made_ready = None  # nvJPEG's first calls made while the model loaded (None: not asked for)
        first_uses_made = None  # the device's first uses made on stand-ins while the model loaded (None: not asked for)
        batches_ahead = taken = None  # the run's first batches decoded while the model loaded, and the run's feed
        if job.todo:  # nothing left to embed: no model to load
            from clip_flash.models import import_model_library

            # (imports neither OpenCLIP nor torchvision: started first, its device and page-locked memory beside the
            # import below where a script has not imported OpenCLIP yet)
            reservation = reserve_pinned_blocks(device, job.source.has_images, pipeline, decode, batch_size,
                                                exact_share, executor, partial(first_images, job.todo))
            import_model_library()  # before the other threads beside the load, which import parts of it
            ahead = inputs_ahead(job.spec.name, job.source, pipeline)
            first_uses = device_first_uses(job, job.source, device, pipeline, decode, batch_size, decode_threads, ahead)
            decoders_ahead = gpu_decoders_ahead(device, job.source, pipeline, decode, decode_threads)
            # the run's first batches, decoded once the blocks and decoders they use are made
            batches_ahead = feed_ahead(job, device, pipeline, decode, batch_size, workers, executor, decode_threads,
                                       exact_share, ahead, after=(reservation, decoders_ahead))
            # The model loads on a thread of its own while this thread, which launches the run's batches, makes
            # the encoder's first uses on a stand-in (some of them are kept per thread).
            loaded, load_ended = load_beside(partial(load_job_model, job, device),
                                             first_uses.make_encoder_first_uses if first_uses is not None else None)
            model_load_seconds = load_ended - setup_started
            job.output.record_settings(job.settings)
            if first_uses is not None:
                first_uses.join()  # its stand-ins' memory is free before the run's peak is measured
                first_uses_made = {"seconds": round(first_uses.seconds, 3),
                                   "steps": {step: round(seconds, 3) for step, seconds in first_uses.steps.items()}}
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            taken = batches_ahead.take(loaded) if batches_ahead is not None else None
            runner = make_runner(loaded, job.source, device, pipeline, decode, batch_size, normalize, out_dtype,
                                 workers, executor, cuda_graphs, decode_threads, exact_share, ahead,
                                 inputs=taken[:2] if taken is not None else None)
            run_options = {"feed": taken[2]} if taken is not None else {}
            # The warm-up does not make again what was made beside the load: the stand-ins' steps, and, where the run's
            # own preparer decoded its first batches on its own decoding threads (decode="gpu": after nvJPEG's first
            # calls), the synthetic images' step.
            made = set(first_uses.steps if first_uses is not None else ()) | ({IMAGE_PATH_STEP} if taken else set())
            if made and hasattr(runner, "made_beside_load"):
                runner.made_beside_load = frozenset(made)
            if hasattr(runner, "warm_up"):
                # The decoder's start; the device half runs at the run's start, beside its first reads.
                warm_up_seconds = runner.warm_up(device=False)
            elif hasattr(runner, "start"):
                runner.start()  # the image decoder, in the background while the run begins
            if reservation is not None:
                reservation.join()  # its blocks are not made beside the run's first batches
                reserved = {"blocks": reservation.blocks_made, "seconds": round(reservation.seconds, 3),
                            "batch_block_bytes": reservation.block_bytes}
            if decoders_ahead is not None:
                decoders_ahead.join()  # its decoder states are not in use when the run's threads take them
                decoders_made_ready = {"seconds": round(decoders_ahead.seconds, 3),
                                       "hardware_decoder": decoders_ahead.hardware_decoded}
            setup_seconds = time.perf_counter() - setup_started
            known = [shard.size for shard in job.todo]
            total = sum(known) if all(size is not None for size in known) else None
            try:
                with _progress(total, progress) as bar:
                    stats = runner.run(job.todo, job.output.write, bar, **run_options)
            finally:
                runner.close()
        options = {"batch_size": batch_size, "workers": workers, "executor": executor, "device": str(device)}
        if job.todo:
            if pipeline != "stock":
                options["decode_threads"] = runner.decode_threads
            options.update(decoding_workers(runner))
            # Whether full image batches replayed a CUDA graph (asked for, on CUDA, chosen on the run's batches).
            options["image_cuda_graphs"] = bool(getattr(runner, "image_graphs_replayed", False))
            if reserved is not None:
                options["pinned_blocks_made_before_the_run"] = reserved
            if decoders_made_ready is not None:
                options["nvjpeg_made_ready_before_the_run"] = decoders_made_ready
            if first_uses_made is not None:
                options["device_first_uses_made_before_the_run"] = first_uses_made
            if batches_ahead is not None:
                options["first_batches_decoded_beside_the_load"] = taken is not None
        return finish_job(job, stats, device=str(device), pipeline=pipeline, gpu_peak=gpu_peak_mib(device),
                          command=command, options=options, environment_device=device, setup_seconds=setup_seconds,
                          warm_up_seconds=warm_up_seconds, model_load_seconds=model_load_seconds)
    finally:
        if batches_ahead is not None:
            batches_ahead.close()  # the load failed, or the model's inputs were not the expected ones
        if taken is not None:
            taken[2].close()  # the run closes its feed; this one, if the run never began
        job.output.close()


@dataclass
class PlannedJob:
    """A job checked against its output folder: what it reads, its settings, and the shards left to do."""

    source: Source
    plan: List[Shard]
    todo: List[Shard]
    settings: Dict[str, Any]
    output: OutputFolder
    spec: Any
    precision: str
    patch: bool
    decode: str


def plan_job(input: Union[str, Path], out: Union[str, Path], model: str, *, device_type: str,
             precision: Optional[str], patch: bool, pipeline: str, decode: str, shard_size: int, normalize: bool,
             out_dtype: str, captions: Optional[bool], caption_column: Optional[str], repeat: int,
             require_captions: bool = False) -> PlannedJob:
    """Check the options, plan the shards, lock (or refuse) the output folder, find the shards left. The
    settings are recorded by the caller once the model has loaded (:meth:`OutputFolder.record_settings`)."""
    from clip_flash.models import parse_model_spec

    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, got {pipeline!r}")
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    if out_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {tuple(OUTPUT_DTYPES)}, got {out_dtype!r}")
    if pipeline == "stock" and patch:
        raise ValueError("pipeline='stock' is the unpatched baseline: pass patch=False with it")
    precision = precision or ("fp16" if device_type == "cuda" else "fp32")
    spec = parse_model_spec(model)
    source = open_source(input, shard_size, captions, caption_column, repeat, require_captions)
    plan = source.shards()
    output = OutputFolder(Path(out), len(plan))
    output.acquire()
    try:
        settings = job_settings(source, plan, model, precision, patch, pipeline, decode, normalize, out_dtype,
                                digest_cache=output.state / CHECKPOINT_DIGESTS_FILE)
        output.check(settings)
        todo = shards_to_do(plan, output)
    except BaseException:
        output.close()
        raise
    for note in source.notes:
        logger.warning("%s", note)
    if spec.kind == "random":
        logger.warning(RANDOM_INIT_WARNING, spec.name, spec.name, spec.name)
    logger.info("%d of %d shards to embed into %s", len(todo), len(plan), out)
    return PlannedJob(source, plan, todo, settings, output, spec, precision, patch, decode)


def load_job_model(job: PlannedJob, device: torch.device) -> Any:
    """The job's model on ``device`` in its precision, patched unless the job is stock."""
    from clip_flash.models import model_spec

    loaded = model_spec.load_model(job.spec, device, job.precision)  # via the module: tests share loaded models
    if job.patch:
        import clip_flash

        clip_flash.patch(loaded.model)
    return loaded


def finish_job(job: PlannedJob, stats: PipelineStats, *, device: str, pipeline: str, gpu_peak: Optional[float],
               command: Optional[str], options: Dict[str, Any], environment_device: torch.device,
               setup_seconds: Optional[float] = None, warm_up_seconds: Optional[float] = None,
               model_load_seconds: Optional[float] = None,
               actor_timeline: Optional[List[Dict[str, Any]]] = None) -> JobSummary:
    """Write failures.parquet and the run record; return the summary."""
    failures_total = job.output.collect_failures([shard.index for shard in job.plan])
    summary = JobSummary(
        out=str(job.output.root), model=job.spec.text, weights=job.spec.weights_note, device=device,
        precision=job.precision, patched=job.patch, pipeline=pipeline,
        decode=job.decode if job.source.has_images else "n/a", shards_planned=len(job.plan),
        shards_skipped=len(job.plan) - len(job.todo), shards_written=stats.shards, rows=stats.rows,
        failures=stats.failures, failures_total=failures_total, seconds=stats.seconds, cpu_cores=usable_cores(),
        gpu_peak_mib=gpu_peak, steady_items_per_s=steady_rate(stats.marks), shard_marks=stats.marks,
        setup_seconds=setup_seconds, model_load_seconds=model_load_seconds,
        warm_up_seconds=(warm_up_seconds or 0.0) + stats.warm_up_seconds if warm_up_seconds is not None else None,
        warm_up_steps={step: round(seconds, 4) for step, seconds in stats.warm_up_steps.items()},
        beside_load_steps=dict(options.get("device_first_uses_made_before_the_run", {}).get("steps", {})),
        first_batch_seconds=stats.first_batch_seconds,
        main_thread_seconds=dict(stats.main_thread_seconds), pinned_blocks_created=stats.pinned_blocks_created,
        pinned_block_seconds=stats.pinned_block_seconds, pinned_block_bytes=stats.pinned_block_bytes,
        actor_timeline=list(actor_timeline or []))
    command = command or "python " + " ".join(shlex.quote(arg) for arg in sys.argv)
    record = run_record(summary, job.settings, environment_device, command, options)
    summary.record_path = str(job.output.write_run_record(record_name(), record))
    return summary
