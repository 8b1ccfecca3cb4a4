#!/usr/bin/env python
"""How much of the thread route's work per image holds the GIL, and how its decoding scales with threads.

    python scripts/image_decode_python_cost.py --photos .device/photos --threads 1 2 8 16 \
        --json results/h100/decode_python_cost.json --markdown results/h100/decode_python_cost.md

Per image, one thread, the kernel route's task (:func:`clip_flash.inputs.arena_regions.decode_into_region`:
file read, Pillow's header parse, torchvision's ``decode_jpeg``, the copy into the arena region, the
bookkeeping) timed three ways: as it runs; with ``decode_jpeg`` replaced by a stand-in returning the same
pixels (what is left is the Python side, which holds the GIL, plus the copy, which does not); and with the
copy left out too (the Python side alone: the GIL's share of a task). Then images/s of
``ImagePreprocessor.decode`` on the kernel route (the decoded batch's plan made, no kernel launched) in a
pool of each thread count, beside plain ``decode_jpeg`` of the same files in as many threads: where the
first stops scaling and the second does not, the difference is the route's own cost. Medians of
``--repeats`` runs, the two alternated.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import open_clip  # noqa: E402
import torch  # noqa: E402
import torchvision.io  # noqa: E402

import clip_flash  # noqa: E402
import clip_flash.inputs.arena_regions as arena_regions  # noqa: E402
from clip_flash.benchmark import results  # noqa: E402
from clip_flash.inputs.image_decoding import DecodeOptions  # noqa: E402
from clip_flash.inputs.transform_spec import spec_from_preprocess  # noqa: E402


def _per_image_us(pairs: List[Any], options: DecodeOptions, region: np.ndarray, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        arena_regions.decode_into_region(pairs, options, region)
        times.append(time.perf_counter() - started)
    return statistics.median(times) / len(pairs) * 1e6


def python_side(paths: List[Path], options: DecodeOptions, repeats: int) -> Dict[str, float]:
    """Microseconds per image of one task, as it runs, with the decoder stubbed, and without the copy too."""
    pairs = list(enumerate(paths))
    region = np.zeros(len(paths) * (3 << 20), dtype=np.uint8)
    real_decode, real_write = torchvision.io.decode_jpeg, arena_regions.write_pixels
    decoded = {}
    for path in paths:
        data = path.read_bytes()
        decoded[len(data)] = real_decode(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    result = {"task_us": _per_image_us(pairs, options, region, repeats)}
    try:
        torchvision.io.decode_jpeg = lambda data, *args, **kwargs: decoded[data.numel()]
        result["decoder_stubbed_us"] = _per_image_us(pairs, options, region, repeats * 4)
        arena_regions.write_pixels = lambda region, pixels: ([-1] * len(pixels), 0, 0)
        result["python_side_us"] = _per_image_us(pairs, options, region, repeats * 4)
    finally:
        torchvision.io.decode_jpeg, arena_regions.write_pixels = real_decode, real_write
    return result


def _raw_decode(path: Path) -> torch.Tensor:
    return torchvision.io.decode_jpeg(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))


def scaling(preprocess: Any, batch: List[Path], threads: int, repeats: int) -> Dict[str, float]:
    """Images/s: ImagePreprocessor.decode on the kernel route, and plain decode_jpeg, in ``threads`` threads."""
    rates: Dict[str, List[float]] = {"route_images_per_s": [], "decode_jpeg_images_per_s": []}
    with clip_flash.ImagePreprocessor(preprocess, device="cpu", dtype=torch.float32, workers=threads,
                                      executor="thread") as prep, ThreadPoolExecutor(threads) as pool:
        prep.resize.implementation = "kernel"  # the GPU's route: decode into arenas, plan the batch
        prep.decode(batch)
        list(pool.map(_raw_decode, batch))
        for _ in range(repeats):
            started = time.perf_counter()
            decoded = prep.decode(batch)
            rates["route_images_per_s"].append(len(batch) / (time.perf_counter() - started))
            del decoded
            started = time.perf_counter()
            list(pool.map(_raw_decode, batch))
            rates["decode_jpeg_images_per_s"].append(len(batch) / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in the pools: no OpenMP team beside the decoding threads
    preprocess = open_clip.image_transform(224, is_train=False)
    options = DecodeOptions(preprocess, spec=spec_from_preprocess(preprocess))
    paths = sorted(path for path in args.photos.iterdir() if path.suffix.lower() in (".jpg", ".jpeg"))
    side = python_side(paths[:16], options, args.repeats)
    print(" ".join(f"{name} {value:.1f}" for name, value in side.items()), flush=True)
    batch = [paths[index % len(paths)] for index in range(args.batch)]
    rows: List[Dict[str, Any]] = []
    for threads in args.threads:
        row = {"threads": threads, **scaling(preprocess, batch, threads, args.repeats)}
        rows.append(row)
        print(row, flush=True)
    lines = [f"Per image, one thread: task {side['task_us']:.1f} us, decoder stubbed {side['decoder_stubbed_us']:.1f} "
             f"us, decoder stubbed and no copy (Python side, GIL held) {side['python_side_us']:.1f} us.", "",
             "| threads | kernel route decode images/s | plain decode_jpeg images/s |", "|---|---|---|"]
    lines += [f"| {row['threads']} | {row['route_images_per_s']:.0f} | {row['decode_jpeg_images_per_s']:.0f} |"
              for row in rows]
    title = (f"The thread route's GIL-held work and its scaling: {len(paths)} JPEGs of {args.photos}, batches of "
             f"{args.batch}, medians of {args.repeats}; host has {len(__import__('os').sched_getaffinity(0))} "
             "usable CPUs.")
    print(title + "\n\n" + "\n".join(lines))
    results.write_microbenchmark(args.json, args.markdown, title, lines, [{"per_image": side}, *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
