#!/usr/bin/env python
"""Where the host's time goes in the exact image pipeline, batch by batch.

    python benchmarks/image_pipeline_timeline.py --photos .device/photos --model ViT-L-14 --json out.json

The same loop as ``bench_clip.py --pipeline exact`` (decode ``IN_FLIGHT`` batches ahead in the pool,
then ``prepare`` and ``encode_image`` per batch, the host kept at most ``IN_FLIGHT`` batches ahead of
the device), with each step of the host's loop timed, and the pixel arenas created counted. Then the
decode step alone at the same settings (no device work), to tell a slow decode from a slow loop.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness import results  # noqa: E402
from clip_flash.models.model_spec import load_model, parse_model_spec  # noqa: E402
from benchmarks.harness.workloads import image_files  # noqa: E402
from clip_flash.inputs import pixel_arena  # noqa: E402

IN_FLIGHT = 2


def count_arenas() -> Dict[str, float]:
    """Wrap Arena creation to count it and time it (creation includes page-locking on a GPU)."""
    stats = {"created": 0, "seconds": 0.0}
    original = pixel_arena.Arena.__init__

    def counting_init(self, size, pin):
        start = time.perf_counter()
        original(self, size, pin)
        stats["created"] += 1
        stats["seconds"] += time.perf_counter() - start

    pixel_arena.Arena.__init__ = counting_init
    return stats


def median_ms(values: List[float]) -> float:
    return 1e3 * statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> Dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.main_threads:
        torch.set_num_threads(args.main_threads)
    loaded = load_model(parse_model_spec(args.model), device, "fp16" if device.type == "cuda" else "fp32")
    clip_flash.patch(loaded.model)
    paths = image_files(args.photos)
    batches = [[paths[(number * args.batch + row) % len(paths)] for row in range(args.batch)]
               for number in range(args.batches)]
    arenas = count_arenas()
    steps = collections.defaultdict(list)
    arenas_per_batch = []
    with clip_flash.ImagePreprocessor(loaded.preprocess, device=device, dtype=loaded.dtype, workers=args.workers,
                                      executor=args.executor) as prep, ThreadPoolExecutor(IN_FLIGHT) as producers, \
            torch.inference_mode():
        pending = collections.deque(producers.submit(prep.decode, files) for files in batches[:IN_FLIGHT])
        events = collections.deque()
        loop_start = time.perf_counter()
        for number in range(args.batches):
            created_before = arenas["created"]
            t0 = time.perf_counter()
            decoded = pending.popleft().result()
            t1 = time.perf_counter()
            if number + IN_FLIGHT < args.batches:
                pending.append(producers.submit(prep.decode, batches[number + IN_FLIGHT]))
            prepared = prep.prepare(decoded)
            t2 = time.perf_counter()
            embeddings = loaded.model.encode_image(prepared.pixels)
            t3 = time.perf_counter()
            if device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
                events.append(event)
                if len(events) > IN_FLIGHT:
                    events.popleft().synchronize()
            t4 = time.perf_counter()
            del decoded, prepared, embeddings
            t5 = time.perf_counter()
            for name, seconds in (("decode_wait", t1 - t0), ("prepare", t2 - t1), ("encode_launch", t3 - t2),
                                  ("device_wait", t4 - t3), ("release", t5 - t4), ("batch", t5 - t0)):
                steps[name].append(seconds)
            arenas_per_batch.append(arenas["created"] - created_before)
        if device.type == "cuda":
            torch.cuda.synchronize()
        loop_seconds = time.perf_counter() - loop_start
        skip = min(args.warmup, args.batches - 1)
        timed = {name: median_ms(values[skip:]) for name, values in steps.items()}
        steady_seconds = sum(steps["batch"][skip:])
        # The decode step alone: the same pool, IN_FLIGHT producers, no device work.
        start = time.perf_counter()
        for future in [producers.submit(prep.decode, files) for files in batches[:args.decode_only_batches]]:
            future.result()
        decode_only = args.decode_only_batches * args.batch / (time.perf_counter() - start)
    return {
        "model": args.model, "batch": args.batch, "batches": args.batches, "warmup_batches": skip,
        "executor": prep.executor, "workers": prep.workers, "main_process_torch_threads": torch.get_num_threads(),
        "images_per_s_whole_loop": args.batches * args.batch / loop_seconds,
        "images_per_s_after_warmup": (args.batches - skip) * args.batch / steady_seconds,
        "median_ms_per_step_after_warmup": timed,
        "arenas_created": arenas["created"], "arena_creation_seconds": arenas["seconds"],
        "arenas_created_per_batch": arenas_per_batch,
        "per_batch_ms": {name: [round(1e3 * value, 2) for value in values] for name, values in steps.items()},
        "decode_only_images_per_s": decode_only,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--decode-only-batches", type=int, default=12)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--executor", default="auto", choices=("auto", "thread", "process"))
    parser.add_argument("--main-threads", type=int, default=0, help="torch.set_num_threads in this process (0: as is)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    data = run(args)
    import json
    import shlex

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data["environment"] = results.environment_record(device, "python " + " ".join(shlex.quote(a) for a in sys.argv))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    summary = {key: value for key, value in data.items() if key not in ("per_batch_ms", "environment")}
    print(summary)


if __name__ == "__main__":
    main()
