#!/usr/bin/env python
"""The host side of ``decode="gpu"``'s CPU step before nvJPEG: ``NativeBatch.decode`` with the JPEGs kept encoded
(``ScanMode.ENCODED``: read, header scan, the items handed to the hardware decoder), as the server's image collect
thread runs it per batch of one-JPEG requests.

Each batch is ``--batch`` request bodies, a bytes object of their own each (cycled from ``--photos``); reported per
round: the median wall and thread CPU time of a batch over ``--batches`` batches. The native batch decoder is the
package's extension where it is built, else its sources built for the CPU (``tests/utils.py``), so this runs on
machines without CUDA; nvJPEG itself is not timed.

    python benchmarks/bench_encoded_step.py --photos DIR --rounds 3 --json out.json --markdown out.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.results import write_microbenchmark  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, required=True, help="a folder of JPEG files (the request bodies)")
    parser.add_argument("--batch", type=int, default=50, help="requests a batch (the server's image batches held "
                                                                "41-63 at saturation)")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="the native decoder's threads")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()

    import open_clip
    import torch

    import clip_flash
    from clip_flash.inputs.image.native_batch import NativeBatch
    from clip_flash.inputs.image.native_decode import NativeBatchDecoder, ScanMode
    from tests.utils import native_batch_decoder

    torch.set_num_threads(1)
    photos = [path.read_bytes() for path in sorted(args.photos.glob("*.jpg"))]
    if not photos:
        parser.error(f"no .jpg files in {args.photos}")
    native, why_not = native_batch_decoder(args.threads)
    if native is None:
        parser.error(f"no native batch decoder: {why_not}")
    source = "the package's extension" if NativeBatchDecoder.create(args.threads) else "its sources built for the CPU"
    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    preparer = clip_flash.ImagePreprocessor(preprocess, device="cpu", dtype=torch.float32, workers=args.threads)
    step = NativeBatch(native, ScanMode.ENCODED, preparer.resize, preparer.options, preparer._python_threads())
    batches = [[bytes(photos[(number * args.batch + item) % len(photos)]) for item in range(args.batch)]
               for number in range(16)]
    for batch in batches:  # warm-up, and every input must come out kept encoded
        decoded = step.decode(batch)
        if len(decoded.items) != args.batch or decoded.failures:
            parser.error(f"a batch was not kept encoded whole: {len(decoded.items)} items, {decoded.failures[:3]}")
    rows: List[Dict[str, Any]] = []
    for round_ in range(args.rounds):
        walls, cpus = [], []
        for number in range(args.batches):
            batch = batches[number % len(batches)]
            cpu, wall = time.thread_time(), time.perf_counter()
            step.decode(batch)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
        row = {"round": round_ + 1, "batch": args.batch, "wall_us_per_batch": statistics.median(walls) * 1e6,
               "cpu_us_per_batch": statistics.median(cpus) * 1e6}
        rows.append(row)
        print(f"round {round_ + 1}: {row['wall_us_per_batch']:.0f} us wall, {row['cpu_us_per_batch']:.0f} us of "
              f"this thread's CPU a batch of {args.batch}", flush=True)
    lines = ["| round | wall us a batch (median) | this thread's CPU us a batch (median) | wall us an image |",
             "|---|---|---|---|"]
    lines += [f"| {row['round']} | {row['wall_us_per_batch']:.0f} | {row['cpu_us_per_batch']:.0f} | "
              f"{row['wall_us_per_batch'] / args.batch:.1f} |" for row in rows]
    mean_kb = statistics.mean(len(photo) for photo in photos) / 1e3
    write_microbenchmark(
        args.json, args.markdown,
        f"decode=\"gpu\"'s CPU step before nvJPEG (`NativeBatch.decode`, JPEGs kept encoded) on batches of "
        f"{args.batch} request bodies ({len(photos)} photos, {mean_kb:.1f} kB on average, a bytes object each), "
        f"{args.batches} batches a round, the native decoder on {args.threads} threads ({source}).", lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
