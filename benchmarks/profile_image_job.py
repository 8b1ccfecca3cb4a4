#!/usr/bin/env python
"""Where an image embedding job's time goes, beside the same model fed by ``bench_clip.py``'s loop.

    python benchmarks/profile_image_job.py --photos .device/photos --model ViT-B-32 --repeat 100 --out $OUT/job_profile

Runs ``clip_flash.embed`` on the photo folder (the list repeated ``--repeat`` times) under a sampling
profiler of every thread (``benchmarks.harness.thread_sampler``) with the job's host steps timed call by
call, then (unless ``--no-bench``) ``bench_clip.py --pipeline``'s own loop (``measure_pipeline``) on the same
photos and model under the same sampler. The two main threads' profiles side by side say what the job's
loop does that the bench's does not. Writes ``job_profile.json`` and ``job_profile.txt`` under ``--out``.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness.results import environment_record  # noqa: E402
from benchmarks.harness.thread_sampler import ThreadSampler, format_report  # noqa: E402

# The job's host steps timed call by call (module, class, method); ``_prepare``/``_decode`` are the preparer's.
JOB_STEPS = (
    ("clip_flash.jobs.pipeline", "EmbeddingPipeline", "_launch"),
    ("clip_flash.jobs.pipeline", "EmbeddingPipeline", "_prepare"),
    ("clip_flash.jobs.pipeline", "EmbeddingPipeline", "_finish"),
    ("clip_flash.jobs.pipeline", "EmbeddingPipeline", "_to_host"),
    ("clip_flash.jobs.pipeline", "EmbeddingPipeline", "_collect"),
    ("clip_flash.jobs.pipeline", "EmbeddingPipeline", "_decode"),
    ("clip_flash.jobs.writer", "OutputFolder", "write"),
)


class StepTimer:
    """Wraps methods so that each call's wall time is recorded (per method, across threads)."""

    def __init__(self) -> None:
        self.calls: Dict[str, List[float]] = collections.defaultdict(list)
        self._restore: List[Tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = owner.__dict__[name]
        calls = self.calls[label]

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                calls.append(time.perf_counter() - started)

        setattr(owner, name, timed)
        self._restore.append((owner, name, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def summary(self) -> Dict[str, Dict[str, float]]:
        out = {}
        for label, values in self.calls.items():
            if values:
                ordered = sorted(values)
                out[label] = {"calls": len(values), "total_s": sum(values),
                              "median_ms": 1e3 * ordered[len(values) // 2],
                              "p90_ms": 1e3 * ordered[int(0.9 * (len(values) - 1))]}
        return out


def profile_job(photos: Path, model: str, repeat: int, decode: str, executor: str, shard_size: int,
                interval: float, device: str = "cuda") -> Dict[str, Any]:
    import importlib

    timer = StepTimer()
    for module, owner, name in JOB_STEPS:
        timer.wrap(getattr(importlib.import_module(module), owner), name, f"{owner}.{name}")
    scratch = Path(tempfile.mkdtemp(prefix="job_profile_"))
    try:
        with ThreadSampler(interval=interval) as sampler:
            summary = clip_flash.embed(photos, scratch / "out", model, device=device, decode=decode,
                                       executor=executor, repeat=repeat, shard_size=shard_size, progress=False)
        # The run record (in the output folder, deleted below) says how the decoding workers started.
        options = json.loads(Path(summary.record_path).read_text()).get("options", {})
    finally:
        timer.restore()
        shutil.rmtree(scratch, ignore_errors=True)
    return {"summary": summary.to_dict(), "steps": timer.summary(), "sampler": sampler.report(),
            "decode_workers": {key: value for key, value in options.items() if key.startswith("decode_")}}


def profile_bench_loop(photos: Path, model: str, batches: int, interval: float) -> Dict[str, Any]:
    from benchmarks.harness.image_pipelines import measure_pipeline
    from clip_flash.environment import usable_cores
    from clip_flash.models.model_spec import load_model, parse_model_spec
    from benchmarks.harness.workloads import image_files

    device = torch.device("cuda")
    loaded = load_model(parse_model_spec(model), device, "fp16")
    clip_flash.patch(loaded.model)
    with ThreadSampler(interval=interval) as sampler:
        row = measure_pipeline("exact", image_files(photos), loaded.preprocess, loaded.model, device, loaded.dtype,
                               tuple(loaded.image_size), 256, batches, 6, usable_cores())
    row.pop("first_batch_embeddings", None)
    return {"row": row, "sampler": sampler.report()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--repeat", type=int, default=100, help="times the photo list is embedded by the job")
    parser.add_argument("--decode", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--executor", default="auto", choices=("auto", "native", "thread"))
    parser.add_argument("--shard-size", type=int, default=2048, help="as bench_embed.py runs the job")
    parser.add_argument("--bench-batches", type=int, default=60, help="timed batches of the bench loop")
    parser.add_argument("--no-bench", action="store_true", help="profile the job only")
    parser.add_argument("--interval", type=float, default=0.002, help="seconds between stack samples")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only to smoke-test the script")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU here", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(shlex.quote(arg) for arg in [sys.argv[0], *(argv or sys.argv[1:])])
    record: Dict[str, Any] = {**environment_record(torch.device(args.device), command)}
    record["job"] = profile_job(args.photos, args.model, args.repeat, args.decode, args.executor, args.shard_size,
                                args.interval, args.device)
    if not args.no_bench and args.device == "cuda":
        record["bench_loop"] = profile_bench_loop(args.photos, args.model, args.bench_batches, args.interval)
    (args.out / "job_profile.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    text = _format(record)
    (args.out / "job_profile.txt").write_text(text + "\n")
    print(text)
    return 0


def _format(record: Dict[str, Any]) -> str:
    job = record["job"]
    summary = job["summary"]
    lines = [f"# command: {record['command']}", f"# git: {record['git_revision']}", f"# {record['device_name']}", "",
             f"JOB: {summary['items']} items, steady {summary.get('steady_items_per_s') or 0:,.0f} items/s, whole run "
             f"{summary['items_per_s']:,.0f}; main thread: "
             + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in summary["main_thread_seconds"].items()),
             f"decoding workers: {job.get('decode_workers') or 'none (threads)'}",
             "host steps (wall time per call):"]
    for label, data in job["steps"].items():
        lines.append(f"  {label:36s} {data['calls']:6d} calls  total {data['total_s']:7.2f} s  median "
                     f"{data['median_ms']:7.2f} ms  p90 {data['p90_ms']:7.2f} ms")
    lines.append(format_report(job["sampler"]))
    bench = record.get("bench_loop")
    if bench:
        row = bench["row"]
        lines += ["", f"BENCH LOOP (bench_clip --pipeline exact): {row['images_per_s']:,.0f} img/s; host per batch "
                  "(median ms): " + ", ".join(f"{name} {ms:.1f}" for name, ms in row["host_ms_median"].items()),
                  format_report(bench["sampler"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
