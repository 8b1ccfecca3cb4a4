#!/usr/bin/env python
"""Where a caption job's time goes on the GPU host: the embedding job under ``torch.profiler``.

    python scripts/profile_caption_job.py --model ViT-L-14 --captions 65536 --out $OUT/caption_job_profile.txt

Runs ``clip_flash.embed`` on a caption file (ImageNet class names x templates) once untimed (not with
``--cold``), then once under the profiler (CPU and CUDA activity), and writes: the job's summary (its main
thread's waits), the GPU's busy time over the run's wall time, and the host operations and CUDA runtime calls
that took the most time (synchronizing calls and page-locked allocations among them name what the host waited on).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import clip_flash  # noqa: E402
from clip_flash.benchmark.results import environment_record  # noqa: E402
from clip_flash.benchmark.workloads import caption_prompts  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--captions", type=int, default=65536)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the job's")
    parser.add_argument("--rows", type=int, default=30, help="host operations listed")
    parser.add_argument("--cold", action="store_true", help="profile the process's first job (no untimed job before)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="caption_job_profile_"))
    try:
        captions = scratch / "captions.txt"
        captions.write_text("\n".join(caption_prompts(args.captions, seed=0)) + "\n")
        job = dict(device="cuda", batch_size=args.batch_size, shard_size=32768, progress=False)
        if not args.cold:
            clip_flash.embed(captions, scratch / "warm", args.model, **job)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            summary = clip_flash.embed(captions, scratch / "profiled", args.model, **job)
            torch.cuda.synchronize()
            wall = time.perf_counter() - started
        events = prof.key_averages()
        gpu_us = sum(event.self_device_time_total for event in events if event.device_type.name == "CUDA")
        host = sorted((event for event in events if event.device_type.name == "CPU"),
                      key=lambda event: event.self_cpu_time_total, reverse=True)[:args.rows]
        env = environment_record(torch.device("cuda"), "python " + " ".join(sys.argv))
        lines = [f"# command: {env['command']}", f"# git: {env['git_revision']}",
                 f"# {env['device_name']}, torch {env['clip_flash_environment'].get('torch')}", "",
                 summary.format(), "",
                 f"profiled call: {wall:.2f} s wall (setup and model load included), GPU kernels and copies "
                 f"{gpu_us / 1e6:.2f} s ({gpu_us / 1e6 / summary.seconds:.0%} of the pipeline's "
                 f"{summary.seconds:.2f} s)", "",
                 f"{'host operation / CUDA runtime call':60s} {'calls':>8s} {'self ms':>10s} {'ms per call':>12s}"]
        for event in host:
            lines.append(f"{event.key[:60]:60s} {event.count:8d} {event.self_cpu_time_total / 1e3:10.1f} "
                         f"{event.self_cpu_time_total / 1e3 / max(event.count, 1):12.3f}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
