#!/usr/bin/env python
"""Images/s of ImagePreprocessor alone (no model): the CPU step, and files -> device-ready batch.

    python benchmarks/image_decode_throughput.py --photos .device/photos --configs native:16 thread:16

For each ``executor:workers`` configuration (executor ``auto``, ``native`` or ``thread``): ``decode``
alone (read, header scan, libjpeg-turbo, pixels or coefficients into page-locked memory) streamed in batches, and
the whole preparation (the next batches decoding while the device resamples this one), in steady state
after warm-up batches. Baseline rows for each worker count: torchvision's plain ``decode_jpeg`` (file
read + decode, nothing else; ``decode_image`` where the folder holds PNGs) and Pillow's ``open`` +
``convert("RGB")`` in a thread pool of that many threads, over the same batches: the gap to them is
ImagePreprocessor's own overhead.

``--jpeg-route on off`` measures each configuration with the exact path's GPU JPEG route (the CPU only
entropy-decodes, see ``clip_flash/inputs/image/jpeg_dct.py``; ``dct_route=True``) and without it (whole
decodes on the CPU), alternated
``--rounds`` times. With the route, ``decode`` is the CPU's share only; compare the files -> device column.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import open_clip  # noqa: E402 - imported at the top, as a user's script does
import torch  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness import results  # noqa: E402
from clip_flash.inputs.image.native_decode import ScanMode  # noqa: E402

IN_FLIGHT = 2


def stream(prep: clip_flash.ImagePreprocessor, batches: List[List[Path]], warmup: int, prepare: bool) -> float:
    """Images/s over the batches after ``warmup``, decoding IN_FLIGHT batches ahead."""
    with ThreadPoolExecutor(IN_FLIGHT) as producers:
        pending = collections.deque(producers.submit(prep.decode, batch) for batch in batches[:IN_FLIGHT])
        images, start = 0, None
        for number in range(len(batches)):
            if number == warmup:
                torch.cuda.synchronize() if prep.device.type == "cuda" else None
                start = time.perf_counter()
            decoded = pending.popleft().result()
            if number + IN_FLIGHT < len(batches):
                pending.append(producers.submit(prep.decode, batches[number + IN_FLIGHT]))
            count = len(decoded.items)
            if prepare:
                count = len(prep.prepare(decoded))
            if number >= warmup:
                images += count
        if prep.device.type == "cuda":
            torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def _read_and_decode_jpeg(path: Path) -> torch.Tensor:
    from torchvision.io import decode_jpeg

    return decode_jpeg(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))


def _read_and_decode_image(path: Path) -> torch.Tensor:
    from torchvision.io import decode_image

    return decode_image(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))


def _pillow_open_convert(path: Path) -> Any:
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def baselines(paths: List[Path]) -> Dict[str, Any]:
    """torchvision's plain decode (``decode_jpeg`` for a folder of JPEGs, else ``decode_image``: libjpeg-turbo or
    libpng) and Pillow's, each in a thread pool."""
    jpegs = all(path.suffix.lower() in (".jpg", ".jpeg") for path in paths)
    return {"decode_jpeg threads (baseline)" if jpegs else "decode_image threads (baseline)":
            _read_and_decode_jpeg if jpegs else _read_and_decode_image,
            "Pillow open+convert threads (baseline)": _pillow_open_convert}


def baseline_rate(decode: Any, batches: List[List[Path]], warmup: int, workers: int) -> float:
    """Images/s of ``decode`` mapped over each batch by a pool of ``workers`` threads, after ``warmup`` batches."""
    with ThreadPoolExecutor(workers) as pool:
        images, start = 0, None
        for number, batch in enumerate(batches):
            if number == warmup:
                start = time.perf_counter()
            for _ in pool.map(decode, batch):
                images += number >= warmup
    return images / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--configs", nargs="+", default=["native:16", "thread:16"],
                        metavar="EXECUTOR:WORKERS")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=16, help="timed batches per measurement")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--jpeg-route", nargs="+", choices=["on", "off"], default=["on"],
                        help="the exact path's GPU JPEG route on (the default where it runs) and/or off")
    parser.add_argument("--rounds", type=int, default=1, help="times each configuration and route is measured")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    preprocess = open_clip.image_transform(args.image_size, is_train=False)
    paths = sorted(path for path in args.photos.iterdir() if path.suffix.lower() in (".jpg", ".jpeg", ".png"))
    total = args.warmup + args.batches
    batches = [[paths[(number * args.batch + row) % len(paths)] for row in range(args.batch)]
               for number in range(total)]
    rows: List[Dict[str, Any]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the pools' workers: no OpenMP team beside the decoding threads
    for workers in sorted({int(config.partition(":")[2] or os.cpu_count()) for config in args.configs}):
        for name, decode in baselines(paths).items():
            rate = baseline_rate(decode, batches, args.warmup, workers)
            rows.append({"executor": name, "workers": workers, "decode_images_per_s": rate,
                         "prepared_images_per_s": None})
            print(f"{name} x{workers}: {rate:.0f} img/s", flush=True)
    torch.set_num_threads(threads)
    for round_number, config, route in [(number, config, route) for number in range(args.rounds)
                                        for config in args.configs for route in args.jpeg_route]:
        executor, _, workers = config.partition(":")
        workers = int(workers) if workers else None
        with clip_flash.ImagePreprocessor(preprocess, device=device, dtype=torch.float16 if device.type == "cuda"
                                          else torch.float32, workers=workers, executor=executor,
                                          dct_route=route == "on") as prep:
            prep.start(wait=True)
            active = prep.native and prep.scan_mode == ScanMode.COEFFICIENTS
            decode_rate = stream(prep, batches, args.warmup, prepare=False)
            prepared_rate = stream(prep, batches, args.warmup, prepare=True)
            rows.append({"executor": executor if executor != "auto" else
                         f"auto ({'native' if prep.native else 'thread'})",
                         "workers": prep.workers, "round": round_number + 1,
                         "jpeg_route": "GPU (entropy decode on CPU)" if active else "CPU (whole decode)",
                         "decode_images_per_s": decode_rate, "prepared_images_per_s": prepared_rate})
        print(f"{config} route {route} ({'active' if active else 'inactive'}): decode {decode_rate:.0f} img/s, "
              f"files -> device batch {prepared_rate:.0f} img/s", flush=True)
    title = (f"ImagePreprocessor alone (exact path, {args.image_size}px) on {len(paths)} files of {args.photos}, "
             f"batches of {args.batch}, {args.batches} timed after {args.warmup} warm-up, {IN_FLIGHT} decoding "
             f"ahead; host has {os.cpu_count()} logical CPUs; device {device}.")
    lines = ["| executor | workers | JPEG decode | round | decode images/s | files -> device batch images/s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {row['executor']} | {row['workers']} | {row.get('jpeg_route', '-')} | {row.get('round', '-')} | "
              f"{row['decode_images_per_s']:.0f} | "
              + ("-" if row["prepared_images_per_s"] is None else f"{row['prepared_images_per_s']:.0f}") + " |"
              for row in rows]
    print(title + "\n\n" + "\n".join(lines))
    results.write_microbenchmark(args.json, args.markdown, title, lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
