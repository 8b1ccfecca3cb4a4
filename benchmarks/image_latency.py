#!/usr/bin/env python
"""Single-request latency, as an embedding server sees it: one JPEG as bytes in, one embedding out.

    python benchmarks/image_latency.py --photos .device/photos --json out.json --markdown out.md

clip_flash side: ``ImagePreprocessor`` (libjpeg-turbo decode on the CPU, exact resize on the GPU) then
``GraphedEncoder`` of the patched model (CUDA graphs); a third side is the same with the JPEG's entropy decode on
one thread (``split_jpegs=False``) instead of split across the native threads. Stock side: OpenCLIP's
``preprocess(Image.open(BytesIO(data)))`` then the unpatched model. Each request ends with the embedding on the
host. The sides alternate in blocks; p50/p99 over ``--requests`` each. Also reported: each step alone (p50), and
the cosine between the two sides' embeddings (same pixels, so only the encoder's fp16 rounding differs), of the
first request and of one after the timed ones. Times of a path that computes the wrong thing are not a
measurement: below ``MIN_COSINE`` either way, when clip_flash's two embeddings of the same bytes differ, or when
the split and one-thread embeddings are not identical, the files are still written, with the check's result, and
the script exits with status 1.
"""
from __future__ import annotations

import argparse
import copy
import io
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness import results  # noqa: E402
from clip_flash.models.model_spec import load_model, parse_model_spec  # noqa: E402

BLOCK = 50  # requests per side before switching
ONE_THREAD = "clip_flash, entropy decode on one thread"


def request_jpeg(args: argparse.Namespace) -> bytes:
    """The request's bytes: --image as is, else the first 640x480 JPEG of --photos, else one made from its
    first photo (resized to 640x480, JPEG q90 4:2:0)."""
    if args.image:
        return args.image.read_bytes()
    files = sorted(path for path in args.photos.iterdir() if path.suffix.lower() in (".jpg", ".jpeg"))
    for path in files:
        with Image.open(path) as image:
            if image.size == (640, 480) and image.format == "JPEG" and image.mode == "RGB":
                return path.read_bytes()
    if not files:
        raise SystemExit(f"error: no JPEG in {args.photos}")
    buffer = io.BytesIO()
    with Image.open(files[0]) as image:
        image.convert("RGB").resize((640, 480), Image.BICUBIC).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def idle(seconds: float, spin: bool) -> None:
    """The host's idle time before a request: asleep (as a server's threads between lone requests), or spinning
    on this thread (its core kept busy); none for 0."""
    if seconds <= 0:
        return
    if not spin:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(call: Callable[[], torch.Tensor], idle_s: float = 0.0, spin: bool = False) -> float:
    """Seconds of one ``call``, after ``idle_s`` of idle time (not timed)."""
    idle(idle_s, spin)
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def native_steps(prep: "clip_flash.ImagePreprocessor", data: bytes) -> Dict[str, Callable[[], object]]:
    """The native decoder's two calls for the one JPEG, alone: the scan (header) and the entropy decode into
    page-locked coefficients (empty where the native decoder does not run here)."""
    from clip_flash.inputs.image.native_decode import COEFFICIENT_BYTES, ScanMode

    native = prep._native_decoder()
    if native is None:
        return {}
    scanned = native.scan([data], ScanMode.COEFFICIENTS)
    coefficients = torch.empty(int(scanned.info[0, COEFFICIENT_BYTES]) + 128, dtype=torch.uint8, pin_memory=True)
    no_pixels, at_zero = np.full(1, -1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return {
        "    native scan (header) of the bytes": lambda: native.scan([data], ScanMode.COEFFICIENTS),
        "    native entropy decode to coefficients, one thread": lambda: native.decode(
            scanned, coefficients[:1], no_pixels, coefficients, at_zero, split_jpegs=False),
        f"    native entropy decode to coefficients, split across {native.threads} threads": lambda: native.decode(
            scanned, coefficients[:1], no_pixels, coefficients, at_zero, split_jpegs=True),
    }


def host_step_targets() -> List[Tuple[str, object, str]]:
    """(label, owner, attribute) of the calls one clip_flash request makes on the host, outermost first."""
    from clip_flash.graphs import capture, encoder
    from clip_flash.inputs.image import jpeg_dct, native_batch, native_decode, preprocessor
    from clip_flash.ops import image_resample

    return [
        ("ImagePreprocessor.decode (the CPU step)", preprocessor.ImagePreprocessor, "decode"),
        ("  NativeBatch.decode", native_batch.NativeBatch, "decode"),
        ("    native scan (header)", native_decode.NativeBatchDecoder, "scan"),
        ("    plan_batch (resize layout)", native_batch, "plan_batch"),
        ("    BatchPlan.allocate_host (page-locked head)", image_resample.BatchPlan, "allocate_host"),
        ("    native decode (entropy, into page-locked memory)", native_decode.NativeBatchDecoder, "decode"),
        ("    plan_dct_batch (the JPEG kernels' table)", native_batch, "plan_dct_batch"),
        ("ImagePreprocessor.prepare (the device step's launches)", preprocessor.ImagePreprocessor, "prepare"),
        ("  upload of the packed batch", image_resample, "_upload"),
        ("  DctBatch.upload (coefficients and the JPEG kernels' table)", jpeg_dct.DctBatch, "upload"),
        ("GraphedEncoder.encode_image (launches)", encoder.GraphedEncoder, "encode_image"),
        ("  CaptureSpace.replay (copy in, replay, copy out)", capture.CaptureSpace, "replay"),
        ("    CUDAGraph.replay", torch.cuda.CUDAGraph, "replay"),
    ]


def host_step_times(request: Callable[[], torch.Tensor], requests: int = 300, idle_s: float = 0.0,
                    spin: bool = False) -> Dict[str, float]:
    """p50 host time (ms) of each call in ``host_step_targets`` over ``requests`` clip_flash requests (each after
    ``idle_s`` of idle time): each call wrapped with a clock for the run, then restored. Host time only: what the
    GPU does after a launch is not in it (the whole request is)."""
    seconds: Dict[str, List[float]] = {}
    originals = []

    def clocked(label: str, function: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds.setdefault(label, []).append(time.perf_counter() - start)
        return call

    try:
        for label, owner, name in host_step_targets():
            # a class's own attribute is put back as it was; one it inherits is removed again
            originals.append((owner, name, vars(owner).get(name)))
            setattr(owner, name, clocked(label, getattr(owner, name)))
        for _ in range(requests):
            idle(idle_s, spin)
            request()
    finally:
        for owner, name, original in reversed(originals):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
    return {label: statistics.median(values) * 1e3 for label, values in seconds.items()}


def write_python_profile(path: Path, request: Callable[[], torch.Tensor], requests: int = 300) -> None:
    """``requests`` calls of ``request`` under cProfile: the host's time by Python function and by each call into
    torch's C++ (its own time, then cumulative), which the wrapped-call table above is too coarse to split."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(requests):
        request()
    profiler.disable()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write(f"{requests} requests\n")
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(60)


def write_profile(folder: Path, request: Callable[[], torch.Tensor], requests: int = 100) -> None:
    """``requests`` calls of ``request`` under torch.profiler (CPU and CUDA): where a single request's time goes,
    host side and device side, as two tables and a Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(requests):
            request()
    averages = profiler.key_averages()
    for sort_by in ("cpu_time_total", "self_cuda_time_total"):
        table = averages.table(sort_by=sort_by, row_limit=40, max_name_column_width=70)
        (folder / f"profile_by_{sort_by}.txt").write_text(f"{requests} requests\n{table}\n")
    profiler.export_chrome_trace(str(folder / "trace.json"))


MIN_COSINE = 0.999  # fp16/bf16 rounding leaves 0.99999+; a wrong row (e.g. pixels of another image) far less


def embedding_check(stock_first: torch.Tensor, fast_first: torch.Tensor, stock_last: torch.Tensor,
                    fast_last: torch.Tensor) -> Tuple[bool, Dict[str, float]]:
    """Whether clip_flash's embeddings of the request agree with stock's, before and after the timed requests,
    and with each other (same bytes, same graph: the same vector, to within 1e-3 of its largest value); the
    figures it judged by."""
    cosine = torch.nn.functional.cosine_similarity
    figures = {
        "embedding_cosine_stock_vs_clip_flash": cosine(stock_first, fast_first).item(),
        "embedding_cosine_stock_vs_clip_flash_after": cosine(stock_last, fast_last).item(),
        "clip_flash_first_vs_after_max_abs": (fast_first - fast_last).abs().max().item(),
    }
    ok = min(figures["embedding_cosine_stock_vs_clip_flash"],
             figures["embedding_cosine_stock_vs_clip_flash_after"]) >= MIN_COSINE \
        and figures["clip_flash_first_vs_after_max_abs"] <= 1e-3 * fast_first.abs().max().item()
    return ok, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViT-L-14", help="NAME, NAME::TAG or NAME::/path (random init if NAME)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", type=Path, help="the JPEG every request sends")
    source.add_argument("--photos", type=Path, help="a folder: its first 640x480 JPEG is the request")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--backend", default="auto", help="clip_flash.patch(model, backend=...) of the clip_flash side")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--host-steps", action="store_true", help="also time each host-side call of 300 clip_flash "
                        "requests (the preparer's and the encoder's steps, p50), in a third table")
    parser.add_argument("--profile", type=Path, help="also run 100 clip_flash requests under torch.profiler and "
                        "write its tables (by CPU and by device time) and a Chrome trace into this folder")
    parser.add_argument("--python-profile", type=Path, help="also run 300 clip_flash requests under cProfile and "
                        "write its tables (by own and by cumulative time) into this file")
    parser.add_argument("--idle-ms", type=float, default=0.0, help="idle time before each timed request (and each "
                        "--host-steps one), the host asleep: a server's between lone requests (20 ms: 50 req/s)")
    parser.add_argument("--idle-spin", action="store_true", help="spend --idle-ms spinning on the requesting thread "
                        "instead of asleep (its core stays busy)")
    args = parser.parse_args()
    idle_s = args.idle_ms / 1e3
    if not torch.cuda.is_available():
        raise SystemExit("error: needs a CUDA GPU (GraphedEncoder)")
    device = torch.device("cuda")
    data = request_jpeg(args)
    loaded = load_model(parse_model_spec(args.model), device, args.dtype)
    stock_model, preprocess, dtype = loaded.model, loaded.preprocess, loaded.dtype
    patched = copy.deepcopy(stock_model)
    clip_flash.patch(patched, backend=args.backend)
    encoder = clip_flash.GraphedEncoder(patched, batch_sizes=(1,))
    encoder.capture_all(image_shape=(3, *loaded.image_size), image_dtype=dtype)
    prep = clip_flash.ImagePreprocessor(preprocess, device=device, dtype=dtype)
    prep_one_thread = clip_flash.ImagePreprocessor(preprocess, device=device, dtype=dtype, split_jpegs=False)

    def stock_request() -> torch.Tensor:
        pixels = preprocess(Image.open(io.BytesIO(data))).unsqueeze(0).to(device, dtype)
        return stock_model.encode_image(pixels).float().cpu()

    def fast_request() -> torch.Tensor:
        prepared = prep([data])
        return encoder.encode_image(prepared.pixels).float().cpu()

    def one_thread_request() -> torch.Tensor:
        prepared = prep_one_thread([data])
        return encoder.encode_image(prepared.pixels).float().cpu()

    pixels = prep([data]).pixels
    steps = {
        "stock preprocess (PIL, CPU)": lambda: preprocess(Image.open(io.BytesIO(data))),
        "clip_flash ImagePreprocessor (to GPU pixels)": lambda: (prep([data]).pixels, torch.cuda.synchronize()),
        "  of which ImagePreprocessor.decode (the CPU step: read, entropy decode)": lambda: prep.decode([data]),
        **native_steps(prep, data),
        "Pillow's whole decode (Image.open + load), for scale": lambda: Image.open(io.BytesIO(data)).load(),
        "stock encode_image": lambda: stock_model.encode_image(pixels).float().cpu(),
        "GraphedEncoder encode_image": lambda: encoder.encode_image(pixels).float().cpu(),
    }
    seconds: Dict[str, List[float]] = {"stock": [], "clip_flash": [], ONE_THREAD: []}
    with torch.inference_mode():
        stock_embedding, fast_embedding = stock_request(), fast_request()
        one_thread_embedding = one_thread_request()
        for _ in range(args.warmup):
            stock_request(), fast_request(), one_thread_request()
        done = 0
        while done < args.requests:
            block = min(BLOCK, args.requests - done)
            order = (("stock", stock_request), ("clip_flash", fast_request), (ONE_THREAD, one_thread_request))
            for side, call in order if (done // BLOCK) % 2 == 0 else order[::-1]:
                seconds[side] += [timed(call, idle_s, args.idle_spin) for _ in range(block)]
            done += block
        step_p50 = {name: statistics.median(timed(call) for _ in range(200)) * 1e3 for name, call in steps.items()}
        host_steps = host_step_times(fast_request, idle_s=idle_s, spin=args.idle_spin) if args.host_steps else {}
        if args.profile:
            write_profile(args.profile, fast_request)
        if args.python_profile:
            write_python_profile(args.python_profile, fast_request)
        embeddings_ok, check = embedding_check(stock_embedding, fast_embedding, stock_request(), fast_request())
        check["split_vs_one_thread_max_abs"] = (fast_embedding - one_thread_embedding).abs().max().item()
        embeddings_ok = embeddings_ok and check["split_vs_one_thread_max_abs"] == 0.0
        split = prep._native_decoder().split_totals() if prep._native_decoder() is not None else {}
    rows = [{
        "side": side,
        "requests": len(values),
        "p50_ms": percentile(values, 50) * 1e3,
        "p99_ms": percentile(values, 99) * 1e3,
        "mean_ms": statistics.fmean(values) * 1e3,
    } for side, values in seconds.items()]
    width, height = Image.open(io.BytesIO(data)).size
    title = (f"Single-request latency, {loaded.spec.text} ({loaded.spec.weights_note.strip() or 'weights given'}, "
             f"{args.dtype}): one {width}x{height} JPEG ({len(data)} bytes) as bytes -> embedding on the host, "
             f"{args.requests} requests per side after {args.warmup} warm-up, sides alternating every {BLOCK}"
             + (f", each after {args.idle_ms:g} ms idle ({'spinning' if args.idle_spin else 'asleep'})"
                if args.idle_ms > 0 else "") + ". "
             f"stock: OpenCLIP preprocess + unpatched model; clip_flash: ImagePreprocessor + GraphedEncoder "
             f"(patched, CUDA graph of batch 1), the JPEG's entropy decode split across the native threads; "
             f"{ONE_THREAD}: the same on one thread (``split_jpegs=False``); split decodes {split.get('split', 0)} "
             f"({split.get('pieces', 0)} pieces), declined {split.get('declined', 0)}, pieces decoded again "
             f"{split.get('decoded_again', 0)}; "
             f"embedding max |split - one thread| {check['split_vs_one_thread_max_abs']:.3g}. "
             f"Embedding cosine stock vs clip_flash: "
             f"{check['embedding_cosine_stock_vs_clip_flash']:.6f} (first request), "
             f"{check['embedding_cosine_stock_vs_clip_flash_after']:.6f} (after the timed ones)"
             + ("." if embeddings_ok else ": CHECK FAILED, clip_flash's embedding is wrong or unstable (first vs "
                f"after max |diff| {check['clip_flash_first_vs_after_max_abs']:.3g}); these times measure a broken "
                "path."))
    lines = ["| side | requests | p50 (ms) | p99 (ms) | mean (ms) |", "|---|---|---|---|---|"]
    lines += [f"| {row['side']} | {row['requests']} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
              f"{row['mean_ms']:.3f} |" for row in rows]
    lines += ["", "| step alone (200 calls) | p50 (ms) |", "|---|---|"]
    lines += [f"| {name} | {ms:.3f} |" for name, ms in step_p50.items()]
    if host_steps:
        lines += ["", "| host time of each call within a clip_flash request (300 requests) | p50 (ms) |", "|---|---|"]
        lines += [f"| {name} | {ms:.3f} |" for name, ms in host_steps.items()]
    print(title + "\n\n" + "\n".join(lines))
    results.write_microbenchmark(args.json, args.markdown, title, lines,
                                 rows + [{"step": name, "p50_ms": ms} for name, ms in step_p50.items()]
                                 + [{"host_call": name, "p50_ms": ms} for name, ms in host_steps.items()]
                                 + [{**check, "embedding_check": "ok" if embeddings_ok else "failed"}])
    prep.close()
    prep_one_thread.close()
    if not embeddings_ok:
        print("error: clip_flash's embedding of the request is wrong or unstable (see the title line)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
