#!/usr/bin/env python
"""What ImagePreprocessor's start costs, and how soon a stream of batches reaches its steady rate.

    python scripts/bench_pool_start.py --photos .device/photos --configs thread:16 process:16 \
        --json results/h100/pool_start.json --markdown results/h100/pool_start.md

Each ``executor:workers`` configuration runs in a fresh Python process (a start cost is only measured
cold: imports, the fork server, worker processes and arenas are per process). In it, as a job would:
torch, OpenCLIP and clip_flash are imported first (not timed: the job has them); with ``--model`` the
model's eval transform comes from building that model (``model load``, timed), which the preparer's start
overlaps when it is begun before the load (``early_start``: the fork server's imports; see
``clip_flash.inputs.worker_processes.prestart``). Then, timed from the preparer's creation: the constructor,
the pool ready (every worker answered a warm-up task), the first batch decoded (and, with a GPU, prepared
on the device), and ``--batches`` more batches streamed with 2 decoding ahead. Reported: seconds to each
point, the steady rate (batches after the first) and the whole-run rate (all images over the time from
the preparer's creation), and the first arena's lease (creation, page faults, page-locking on a GPU)
beside a reused one's. CPU runs take the GPU's route through the pool (decoding into shared pixel arenas, the
kernel's batch plan made) and stop at the decoded batch (no kernel there; Pillow's resize on the CPU would hide
the pool's time); with a GPU the batches are prepared on it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

AHEAD = 2  # batches decoding ahead of the one being consumed, as image_decode_throughput.py streams


def _photos(folder: Path) -> List[Path]:
    return sorted(path for path in folder.iterdir() if path.suffix.lower() in (".jpg", ".jpeg", ".png"))


def run_case(args: argparse.Namespace, executor: str, workers: Optional[int], method: str = "") -> Dict[str, Any]:
    """One configuration, in this (fresh) process; ``method`` forces the worker processes' start method."""
    import open_clip
    import torch

    import clip_flash
    from clip_flash.inputs import worker_processes
    from clip_flash.inputs.pixel_arena import ArenaPool

    if method:
        worker_processes.process_start_method = lambda: method

    device = torch.device("cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu")
    on_gpu = device.type == "cuda"
    record: Dict[str, Any] = {"executor": executor, "start_method": None}
    prestart = getattr(worker_processes, "prestart", None)
    began = time.perf_counter()
    if args.early_start and prestart is not None and executor != "thread":
        prestart()  # the fork server imports the decoding modules while the model loads
    if args.model:
        loaded = open_clip.create_model_and_transforms(args.model, device=device)
        preprocess = loaded[2]
        record["model_load_s"] = time.perf_counter() - began
    else:
        preprocess = open_clip.image_transform(args.image_size, is_train=False)
    paths = _photos(args.photos)
    batches = [[paths[(number * args.batch + row) % len(paths)] for row in range(args.batch)]
               for number in range(1 + args.batches)]
    created = time.perf_counter()
    prep = clip_flash.ImagePreprocessor(preprocess, device=device, dtype=torch.float16 if on_gpu else torch.float32,
                                        workers=workers, executor=executor)
    marks = {"constructor_s": time.perf_counter() - created}
    if not on_gpu:
        # The GPU's route: workers decode into shared pixel arenas and the batch plan is made from the sizes
        # (prepare, i.e. the kernel, is not run on the CPU).
        prep.resize.implementation = "kernel"
    record.update(executor=prep.executor, workers=prep.workers,
                  start_method=getattr(prep.pool, "start_method", "spawn" if prep.executor == "process" else None))
    start = getattr(prep, "start", None)
    if args.wait_ready and start is not None:
        start(wait=True)
        marks["pool_ready_s"] = time.perf_counter() - created
    images, steady_images, steady_from = 0, 0, None
    with ThreadPoolExecutor(AHEAD) as producers:
        pending = collections.deque(producers.submit(prep.decode, batch) for batch in batches[:AHEAD])
        for number in range(len(batches)):
            decoded = pending.popleft().result()
            if number + AHEAD < len(batches):
                pending.append(producers.submit(prep.decode, batches[number + AHEAD]))
            count = len(decoded.items)
            if on_gpu:
                count = len(prep.prepare(decoded))
                torch.cuda.synchronize()
            del decoded
            images += count
            if number == 0:
                marks["first_batch_s"] = time.perf_counter() - created
                steady_from = time.perf_counter()
            else:
                steady_images += count
    ended = time.perf_counter()
    prep.close()
    record.update(marks)
    record["steady_images_per_s"] = steady_images / (ended - steady_from)
    record["whole_run_images_per_s"] = images / (ended - created)
    record["images"] = images
    arenas = ArenaPool(pin=on_gpu)
    for label in ("arena_first_lease_s", "arena_reused_lease_s"):
        started = time.perf_counter()
        lease, _ = arenas.lease(args.batch)
        lease.tensor[::4096] = 1  # the workers' first touch of each page
        record[label] = time.perf_counter() - started
        del lease
    arenas.close()
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--configs", nargs="+", default=["thread:16", "process:16"],
                        metavar="EXECUTOR:WORKERS[:START_METHOD]",
                        help="e.g. thread:16, process:16 (fork server where there is one), process:16:spawn")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=12, help="batches after the first (the steady rate)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--model", default=None, help="build this OpenCLIP model first (random init), as a job does")
    parser.add_argument("--early-start", action="store_true",
                        help="start the process pool's fork server before the model load (as the job does)")
    parser.add_argument("--wait-ready", action="store_true", help="also time start(wait=True) on its own")
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one) or cpu")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # a child process runs one configuration
    args = parser.parse_args()
    if args.case is not None:
        executor, workers, method = (args.case.split(":") + ["", ""])[:3]
        print(json.dumps(run_case(args, executor, int(workers) if workers else None, method)))
        return 0
    rows = []
    forwarded = [arg for arg in sys.argv[1:]]
    for config in args.configs:
        child = subprocess.run([sys.executable, __file__, *forwarded, "--case", config], capture_output=True,
                               text=True)
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return child.returncode
        row = json.loads(child.stdout.strip().splitlines()[-1])
        row["config"] = config
        rows.append(row)
        print(json.dumps(row), flush=True)
    columns = ["config", "start_method", "model_load_s", "constructor_s", "pool_ready_s", "first_batch_s",
               "steady_images_per_s", "whole_run_images_per_s", "arena_first_lease_s", "arena_reused_lease_s"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [row.get(column) for column in columns]
        lines.append("| " + " | ".join("-" if cell is None else f"{cell:.3f}" if isinstance(cell, float)
                                       else str(cell) for cell in cells) + " |")
    title = (f"ImagePreprocessor start cost and rates: {len(_photos(args.photos))} files of {args.photos}, "
             f"{1 + args.batches} batches of {args.batch} ({AHEAD} decoding ahead), each configuration in a fresh "
             f"process; times in seconds from the preparer's creation; model {args.model or 'none'}, early start "
             f"{args.early_start}; host has {os.cpu_count()} logical CPUs, {len(os.sched_getaffinity(0))} usable.")
    print(title + "\n\n" + "\n".join(lines))
    if args.json or args.markdown:
        from clip_flash.benchmark import results

        results.write_microbenchmark(args.json, args.markdown, title, lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
