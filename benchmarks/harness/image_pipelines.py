"""End to end, files to embeddings: how many images per second each input pipeline feeds a model.

- ``stock``: what users run today: OpenCLIP's ``preprocess(Image.open(path))`` in a torch
  ``DataLoader`` with one worker process per core, batches copied to the device and encoded.
- ``exact``: ``clip_flash.ImagePreprocessor`` (CPU decode in a pool, Pillow-exact resize on the
  device); the next batches decode while the device works on this one.
- ``gpu``: the same with ``decode="gpu"`` (nvJPEG; not Pillow's pixels), chroma re-upsampled the
  libjpeg way (the default ``gpu_chroma``);
- ``gpu-nvjpeg-chroma``: ``decode="gpu"`` keeping nvJPEG's own chroma (further from Pillow, less work).

All three feed the same (patched) model, so the difference is the input side alone. Each streams
the folder's files round and round in batches; the first batches warm up (workers started, queues
full), the next ones are timed in steady state, with the device synchronized at both ends (the clock
stops at the last batch's embeddings, before the pools shut down: a long job pays that once).
A file that cannot be read is skipped and reported, never fatal.
"""
from __future__ import annotations

import collections
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from PIL import Image

import clip_flash
from clip_flash.environment import usable_cores

PIPELINES = ("stock", "exact", "gpu", "gpu-nvjpeg-chroma")
PIPELINE_NOTES = {
    "stock": "OpenCLIP preprocess(Image.open(p)) in a torch DataLoader, one worker process per core",
    "exact": "clip_flash.ImagePreprocessor (CPU decode, exact resize on the device)",
    "gpu": "clip_flash.ImagePreprocessor(decode='gpu') (nvJPEG decode: not exact)",
    "gpu-nvjpeg-chroma": "clip_flash.ImagePreprocessor(decode='gpu', gpu_chroma='nvjpeg') (not exact)",
}
IN_FLIGHT = 2  # batches decoding ahead of the one on the device
HOST_STEPS = ("decode_wait", "prepare", "encode_launch", "device_wait")
# Untimed batches before clip_flash's pipelines are timed: the first few page-lock the host buffers that
# torch's allocator then reuses (one set per batch in flight), a one-time cost of a long job.
CLIP_FLASH_WARMUP = 2 * IN_FLIGHT + 2


class _PreprocessDataset(torch.utils.data.Dataset):
    """File ``index % len(paths)`` through ``preprocess``; an unreadable file gives its reason instead."""

    def __init__(self, paths: Sequence[Path], preprocess: Callable, length: int, size: Tuple[int, int]) -> None:
        self.paths, self.preprocess, self.length, self.size = list(paths), preprocess, length, size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        path = self.paths[index % len(self.paths)]
        try:
            with Image.open(path) as image:
                return self.preprocess(image), ""
        except Exception as error:  # noqa: BLE001 - a bad file is skipped, as a careful user would
            return torch.zeros(3, *self.size), f"{path}: {type(error).__name__}: {error}"


def _stream_stock(paths, preprocess, size, model, device, dtype, batch, total, workers, on_batch):
    loader = torch.utils.data.DataLoader(
        _PreprocessDataset(paths, preprocess, batch * total, size), batch_size=batch, num_workers=workers,
        pin_memory=device.type == "cuda", prefetch_factor=2 if workers else None)
    for number, (pixels, reasons) in enumerate(loader):
        keep = [row for row, reason in enumerate(reasons) if not reason]
        if len(keep) < len(reasons):
            pixels = pixels[keep]
        embeddings = model.encode_image(pixels.to(device, dtype, non_blocking=True))
        on_batch(number, embeddings, [reason for reason in reasons if reason], {})


def _stream_clip_flash(paths, preprocess, pipeline, model, device, dtype, batch, total, workers, executor,
                       on_batch):
    batches = [[paths[(number * batch + row) % len(paths)] for row in range(batch)] for number in range(total)]
    decode = "cpu" if pipeline == "exact" else "gpu"
    chroma = "nvjpeg" if pipeline == "gpu-nvjpeg-chroma" else "libjpeg"
    with clip_flash.ImagePreprocessor(preprocess, device=device, dtype=dtype, decode=decode, workers=workers,
                                      executor=executor, gpu_chroma=chroma) as prep, \
            ThreadPoolExecutor(IN_FLIGHT) as producers:
        on_batch.executor = "native" if prep.native else "thread"  # what "auto" chose, for the results
        # Steady-state rates: the worker processes, not the threads that decode until they are up.
        prep.start(wait=True)
        # How long the host waited for each batch's decode: near zero when decoding keeps ahead of the device.
        # Where the host's loop spends each batch (seconds): waiting for its decode, the device step's
        # launches, the encoder's launches, and waiting for the device to come within IN_FLIGHT batches.
        on_batch.host_steps = steps = {name: [] for name in HOST_STEPS}
        pending = collections.deque(producers.submit(prep.decode, files) for files in batches[:IN_FLIGHT])
        done_events: collections.deque = collections.deque()
        for number in range(total):
            started = time.perf_counter()
            decoded = pending.popleft().result()
            decoded_at = time.perf_counter()
            if number + IN_FLIGHT < total:
                pending.append(producers.submit(prep.decode, batches[number + IN_FLIGHT]))
            prepared = prep.prepare(decoded)
            prepared_at = time.perf_counter()
            embeddings = model.encode_image(prepared.pixels)
            launched_at = time.perf_counter()
            if device.type == "cuda":  # keep the host at most IN_FLIGHT batches ahead of the device
                event = torch.cuda.Event()
                event.record()
                done_events.append(event)
                if len(done_events) > IN_FLIGHT:
                    done_events.popleft().synchronize()
            for name, seconds in zip(HOST_STEPS, (decoded_at - started, prepared_at - decoded_at,
                                                  launched_at - prepared_at, time.perf_counter() - launched_at)):
                steps[name].append(seconds)
            reasons = [f"{batches[number][index]}: {reason}" for index, reason in prepared.failures]
            on_batch(number, embeddings, reasons, prepared.routes)


def measure_pipeline(pipeline: str, paths: Sequence[Path], preprocess: Callable, model: torch.nn.Module,
                     device: torch.device, dtype: torch.dtype, image_size: Tuple[int, int], batch: int,
                     batches: int, warmup: int, workers: int, executor: str = "auto") -> Dict[str, Any]:
    """Images/s of one pipeline over ``batches`` timed batches after ``warmup`` untimed ones."""
    total = warmup + batches
    state: Dict[str, Any] = {"start": None, "images": 0, "failures": {}, "routes": collections.Counter(),
                             "first_batch": None}

    def on_batch(number: int, embeddings: torch.Tensor, reasons: List[str], routes: Dict[str, int]) -> None:
        for reason in reasons:
            state["failures"][reason.split(": ")[0]] = reason
        if number == 0:  # the same files in every pipeline: their embeddings are compared afterwards
            state["first_batch"] = embeddings.float().cpu()
        if number == warmup - 1:
            clip_flash_sync(device)
            state["start"] = time.perf_counter()
        elif number >= warmup:
            state["images"] += embeddings.shape[0]
            state["routes"].update(routes)
        if number == total - 1:  # the clock stops here: shutting the pools down is not part of the rate
            clip_flash_sync(device)
            state["end"] = time.perf_counter()

    with torch.inference_mode():
        if pipeline == "stock":
            _stream_stock(paths, preprocess, image_size, model, device, dtype, batch, total, workers, on_batch)
        else:
            _stream_clip_flash(paths, preprocess, pipeline, model, device, dtype,
                               batch, total, workers, executor, on_batch)
    seconds = state["end"] - state["start"]
    host_steps = {name: values[warmup:] for name, values in getattr(on_batch, "host_steps", {}).items()}
    return {
        "pipeline": pipeline,
        "note": PIPELINE_NOTES[pipeline],
        "cpu_workers": workers,
        "executor": "processes (DataLoader)" if pipeline == "stock" else getattr(on_batch, "executor", executor),
        "batch": batch,
        "timed_batches": batches,
        "warmup_batches": warmup,
        "images_embedded": state["images"],
        "seconds": seconds,
        "images_per_s": state["images"] / seconds,
        "routes": dict(state["routes"]),
        "decode_wait_ms_median": (1e3 * statistics.median(host_steps["decode_wait"])
                                  if host_steps.get("decode_wait") else None),
        "host_ms_median": {name: 1e3 * statistics.median(values) for name, values in host_steps.items() if values},
        "skipped_files": sorted(state["failures"].values()),
        "first_batch_embeddings": state["first_batch"],
    }


def clip_flash_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def encoder_only(model: torch.nn.Module, pixels: torch.Tensor, repeats: int = 10) -> Dict[str, float]:
    """The model alone on an already prepared batch: median ms per call and images/s."""
    device = pixels.device
    times = []
    warmup = 2 if repeats > 1 else 0
    with torch.inference_mode():
        for number in range(repeats + warmup):
            clip_flash_sync(device)
            start = time.perf_counter()
            model.encode_image(pixels)
            clip_flash_sync(device)
            if number >= warmup:
                times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"batch": pixels.shape[0], "ms": median * 1e3, "images_per_s": pixels.shape[0] / median}


def device_step_profile(prep: "clip_flash.ImagePreprocessor", paths: Sequence[Path], repeats: int = 3
                        ) -> Optional[Dict[str, Any]]:
    """GPU time of ``prep.prepare`` for one batch (kernels and copies, from the profiler)."""
    if prep.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    decoded = prep.decode(list(paths))
    for _ in range(2):
        prep.prepare(decoded)
    clip_flash_sync(prep.device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(repeats):
            prep.prepare(decoded)
        clip_flash_sync(prep.device)
    kernels: Dict[str, float] = collections.Counter()
    copies = 0.0
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        duration_ms = event.time_range.elapsed_us() / 1e3  # a kernel's or copy's own span on the GPU
        if "memcpy" in event.name.lower() or "memset" in event.name.lower():
            copies += duration_ms
        else:
            kernels[event.name] += duration_ms
    return {
        "batch": len(decoded.items),
        "kernel_ms": sum(kernels.values()) / repeats,
        "copy_ms": copies / repeats,
        "kernels": {name: ms / repeats for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:5]},
    }


def measure_image_pipelines(model: torch.nn.Module, preprocess: Callable, paths: Sequence[Path],
                            pipelines: Sequence[str], device: torch.device, dtype: torch.dtype,
                            image_size: Tuple[int, int], batch: int = 256, batches: int = 24,
                            workers: Optional[int] = None, executor: str = "auto", warmup: Optional[int] = None,
                            encoder_repeats: int = 10) -> Dict[str, Any]:
    """Every requested pipeline, the encoder alone on a prepared batch, and the device step's GPU time.

    ``warmup``: untimed batches first (default: ``CLIP_FLASH_WARMUP``, and for ``stock`` one per DataLoader
    worker plus one, so every worker has a batch in flight before the clock starts).
    """
    workers = workers or usable_cores()
    rows = []
    for pipeline in pipelines:
        # The stock DataLoader needs a batch per worker in flight before it reaches steady state.
        first = warmup or (max(3, workers + 1) if pipeline == "stock" else CLIP_FLASH_WARMUP)
        rows.append(measure_pipeline(pipeline, paths, preprocess, model, device, dtype, image_size, batch,
                                     batches, first, workers, executor))
    # The first batch holds the same files in every pipeline: same pixels must give the same embeddings.
    firsts = [row.pop("first_batch_embeddings") for row in rows]
    reference = next((first for row, first in zip(rows, firsts) if row["pipeline"] == "stock"), None)
    for row, first in zip(rows, firsts):
        if reference is not None and row["pipeline"] != "stock" and first.shape == reference.shape:
            row["first_batch_vs_stock"] = {
                "max_abs_diff": (first - reference).abs().max().item(),
                "min_cosine": torch.nn.functional.cosine_similarity(first, reference, dim=-1).min().item(),
            }
    sample = [paths[index % len(paths)] for index in range(batch)]
    with clip_flash.ImagePreprocessor(preprocess, device=device, dtype=dtype, workers=workers,
                                      executor="thread") as prep:  # one sample batch, Pillow's way
        prepared = prep(sample)
        if len(prepared) == 0:
            raise ValueError(f"none of the first {batch} files could be read: {prepared.failures[:3]}")
        # A full batch of readable images (repeated if some were skipped).
        encoder = encoder_only(model, prepared.pixels[torch.arange(batch, device=device) % len(prepared)],
                               encoder_repeats)
        step = device_step_profile(prep, sample)
    if step is not None:
        step["encoder_ms"] = encoder["ms"] * step["batch"] / encoder["batch"]
        step["kernel_share_of_gpu"] = step["kernel_ms"] / (step["kernel_ms"] + step["copy_ms"] + step["encoder_ms"])
    return {"files": len(paths), "cpu_cores": usable_cores(), "pipelines": rows, "encoder_only": encoder,
            "device_step": step}


def format_image_pipelines(data: Dict[str, Any]) -> str:
    """The end-to-end table and the device step's cost, as markdown."""
    from .results import markdown_table

    encoder_rate = data["encoder_only"]["images_per_s"]
    stock = next((row["images_per_s"] for row in data["pipelines"] if row["pipeline"] == "stock"), None)
    columns = ("pipeline", "images/s", "vs stock (x)", "of encoder alone", "CPU workers", "skipped files", "routes",
               "1st batch vs stock: max abs diff / min cos", "host waited for decode (median ms per batch)",
               "host per batch: prepare / encoder launch / device wait (median ms)")
    table_rows = []
    for row in data["pipelines"]:
        routes = ", ".join(f"{name} {count}" for name, count in sorted(row["routes"].items())) or "-"
        table_rows.append((
            f"{row['pipeline']}: {row['note']}",
            f"{row['images_per_s']:.0f}",
            f"{row['images_per_s'] / stock:.2f}" if stock else "-",
            f"{100 * row['images_per_s'] / encoder_rate:.0f}%",
            f"{row['cpu_workers']} ({row['executor']})",
            str(len(row["skipped_files"])),
            routes,
            (f"{row['first_batch_vs_stock']['max_abs_diff']:.3g} / {row['first_batch_vs_stock']['min_cosine']:.6f}"
             if "first_batch_vs_stock" in row else "-"),
            f"{row['decode_wait_ms_median']:.1f}" if row.get("decode_wait_ms_median") is not None else "-",
            (" / ".join(f"{row['host_ms_median'][name]:.1f}" for name in HOST_STEPS[1:])
             if row.get("host_ms_median") else "-"),
        ))
    first = data["pipelines"][0] if data["pipelines"] else {"batch": "-", "timed_batches": "-"}
    text = (f"Images end to end: {data['files']} files from the folder, streamed in batches of {first['batch']}, "
            f"{first['timed_batches']} batches timed after warm-up, on a {data['cpu_cores']}-core host; every "
            f"pipeline feeds the same patched model\n\n" + markdown_table(columns, table_rows))
    text += (f"\n\nEncoder alone on a prepared batch of {data['encoder_only']['batch']}: "
             f"{data['encoder_only']['ms']:.2f} ms ({encoder_rate:.0f} images/s)")
    step = data.get("device_step")
    if step:
        top = "; ".join(f"{name[:60]} {ms:.3f} ms" for name, ms in step["kernels"].items())
        text += (f"\n\nDevice step of the exact path (`prepare`, batch {step['batch']}), GPU time from the profiler: "
                 f"kernels {step['kernel_ms']:.3f} ms, copies {step['copy_ms']:.3f} ms; with the encoder "
                 f"({step['encoder_ms']:.2f} ms) the kernels are {100 * step['kernel_share_of_gpu']:.1f}% of the "
                 f"GPU time per batch. Kernels: {top}")
    skipped_by_path: Dict[str, str] = {}
    for row in data["pipelines"]:
        for reason in row["skipped_files"]:
            skipped_by_path.setdefault(reason.split(": ")[0], reason)
    skipped = sorted(skipped_by_path.values())
    if skipped:
        listed = "\n".join(f"- {reason}" for reason in skipped[:20])
        text += f"\n\nSkipped {len(skipped)} unreadable file(s):\n{listed}"
    return text


def measure_bench_pipelines(model: torch.nn.Module, loaded: Any, settings: Any) -> Dict[str, Any]:
    """``measure_image_pipelines`` for bench_clip: the loaded model's preprocess, the ``--images`` folder."""
    from .workloads import image_files

    return measure_image_pipelines(
        model, loaded.preprocess, image_files(settings.images_dir), settings.pipelines, settings.device,
        loaded.dtype, tuple(loaded.image_size), settings.pipeline_batch, settings.pipeline_batches,
        settings.pipeline_workers, settings.pipeline_executor, settings.pipeline_warmup)
