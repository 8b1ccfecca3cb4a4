#!/usr/bin/env python
"""Where the fast path's time goes (``decode="gpu"``), step by step, for one batch of photos.

    python benchmarks/bench_gpu_decode_steps.py --photos .device/photos --json out.json

Each step is timed on its own with the device synchronized before and after (median of ``--repeats``
after two warm-up calls): the CPU step (files read, headers scanned), torchvision's batched nvJPEG decode
alone, the hardware route (where it runs, unless ``nvjpeg_hardware=False``; decode straight into the resize
kernel's layout, with each chroma), torchvision's decode as the fast path runs it, the libjpeg-style chroma
step on its pixels, and ``prepare`` after ``decode`` (the resize kernel, and for what ``decode`` left to
torchvision: nvJPEG, chroma step, packing) with each ``gpu_chroma``. The exact path's device step is given beside it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness import results  # noqa: E402
from clip_flash.models.model_spec import load_model, parse_model_spec  # noqa: E402
from benchmarks.harness.workloads import image_files  # noqa: E402
from clip_flash.inputs.image import gpu_jpeg, nvjpeg_packed  # noqa: E402
from clip_flash.inputs.image.image_decoding import EncodedJpeg  # noqa: E402


def timed_ms(step: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``step`` with the device idle before and synchronized after."""
    times = []
    for number in range(repeats + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if number >= 2:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--model", default="ViT-B-32", help="whose preprocess (only the transform is used)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    preprocess = load_model(parse_model_spec(args.model), torch.device("cpu"), "fp32").preprocess
    paths = image_files(args.photos)
    batch = [paths[index % len(paths)] for index in range(args.batch)]
    steps: Dict[str, float] = {}
    with clip_flash.ImagePreprocessor(preprocess, device=device, dtype=torch.float16, decode="gpu",
                                      executor="thread") as fast, \
            clip_flash.ImagePreprocessor(preprocess, device=device, dtype=torch.float16, decode="gpu",
                                         executor="thread", gpu_chroma="nvjpeg") as fast_nvjpeg, \
            clip_flash.ImagePreprocessor(preprocess, device=device, dtype=torch.float16, executor="thread") as exact:
        decoded = fast.decode(batch)
        jpegs = [item for item in decoded.items if isinstance(item, EncodedJpeg)]
        with clip_flash.ImagePreprocessor(preprocess, device=device, dtype=torch.float16, decode="gpu",
                                          nvjpeg_hardware=False) as reader:
            steps["CPU step: read files, scan headers (native)"] = timed_ms(lambda: reader.decode(batch),
                                                                           args.repeats)
        steps["nvJPEG batched decode (torchvision)"] = timed_ms(
            lambda: gpu_jpeg._nvjpeg([item.encoded for item in jpegs], device), args.repeats)
        if nvjpeg_packed.hardware_decoder_usable():
            spec = fast.resize.spec
            for chroma in gpu_jpeg.CHROMA:
                steps[f"hardware route: decode into the kernel's layout, {chroma} chroma"] = timed_ms(
                    lambda: nvjpeg_packed.decode_into_layout(jpegs, device, spec, chroma), args.repeats)
        steps["torchvision's decode as the fast path runs it, (H, W, C) pixels"] = timed_ms(
            lambda: gpu_jpeg._decode_with_torchvision(jpegs, device), args.repeats)
        pairs, _ = gpu_jpeg._decode_with_torchvision(jpegs, device)
        steps["libjpeg-style chroma step"] = timed_ms(lambda: gpu_jpeg._refine_chroma(pairs), args.repeats)
        groups = {(tuple(pixels.shape), item.jpeg_sampling) for item, pixels in pairs}
        steps["prepare() after decode(): libjpeg chroma, resize"] = timed_ms(
            lambda: fast.prepare(decoded), args.repeats)
        decoded_nvjpeg = fast_nvjpeg.decode(batch)
        steps["prepare() after decode(): nvJPEG's chroma, resize"] = timed_ms(
            lambda: fast_nvjpeg.prepare(decoded_nvjpeg), args.repeats)
        decoded_exact = exact.decode(batch)
        steps["exact path: prepare() (upload + resize kernel)"] = timed_ms(lambda: exact.prepare(decoded_exact),
                                                                          args.repeats)
    data = {
        "batch": args.batch, "jpegs": len(jpegs), "chroma_groups": len(groups),
        "median_ms": steps,
        "images_per_s": {name: args.batch / (ms / 1e3) for name, ms in steps.items()},
        "environment": results.environment_record(device, "python " + " ".join(shlex.quote(a) for a in sys.argv)),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    for name, ms in steps.items():
        print(f"{ms:9.2f} ms  {args.batch / (ms / 1e3):9.0f} img/s  {name}")
    print(f"{len(jpegs)} JPEGs, {len(groups)} (size, sampling) groups in the chroma step")


if __name__ == "__main__":
    main()
