#!/usr/bin/env python
"""Where a fresh process's embedding job spends its start, step by step: the model load and the stand-ins beside it,
the pipeline's construction, the device warm-up (its synthetic decode, the encoders' first calls beside it), and the
first full image batches' launches (with the device memory segments each made), the third of which captures the
image graph when one is kept.

    python benchmarks/probe_job_start.py --photos DIR --json OUT.json --markdown OUT.md [--model ViT-B-32]
        [--repeat 20] [--capture always|default]

Runs ``clip_flash.embed`` once, from a script importing ``open_clip`` at the top as a user's does, with the
steps wrapped in timers (each full image batch's encode synchronised before and after, so its launch and its
device time are its own). ``--capture always`` sets ``GRAPH_MIN_BATCHES_LEFT`` to 0, so that a short run captures
the graph and the capture's cost shows.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import open_clip  # noqa: E402,F401 - imported at the top, as a user's script does
import torch  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness.results import markdown_table, write_microbenchmark  # noqa: E402
from clip_flash.jobs import device_ahead, feed_ahead, job as job_module, pipeline as pipeline_module, warm_up  # noqa: E402,E501


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--capture", choices=("always", "default"), default="always")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.capture == "always":
        warm_up.GRAPH_MIN_BATCHES_LEFT = 0
    started = time.perf_counter()
    rows = []

    def timed(owner, name, label, first=None):
        original = getattr(owner, name)
        calls = [0]

        def wrapper(*call_args, **call_kwargs):
            calls[0] += 1
            call = calls[0]  # (calls from several threads at once: this one's number, not the latest)
            begun = time.perf_counter()
            result = original(*call_args, **call_kwargs)
            if first is None or call <= first:
                rows.append({"step": label.format(call), "from_ms": 1e3 * (begun - started),
                             "ms": 1e3 * (time.perf_counter() - begun)})
            return result
        setattr(owner, name, wrapper)

    timed(job_module, "load_job_model", "model load")
    timed(job_module, "make_runner", "pipeline built")
    timed(pipeline_module, "warm_up_device", "device warm-up (all of it)")
    timed(device_ahead.DeviceFirstUses, "_vision_tower", "beside the load: the stand-in tower, full batch and one row")
    timed(warm_up, "prepare_synthetic_images", "synthetic images decoded and prepared (beside the load, or in the "
          "device warm-up)")
    # the CPU half of the first batches: in the feed started beside the load, or in the run's own
    timed(feed_ahead, "decode_batch", "batch {} decoded (beside the load)", first=4)
    timed(pipeline_module, "decode_batch", "batch {} decoded (in the run)", first=4)
    timed(warm_up, "_warm_up_encoders", "device warm-up: the encoders' first calls, beside the images")
    encode_image = pipeline_module.EmbeddingPipeline._encode_image
    full = [0]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def segments_made() -> int:
        """cudaMalloc calls torch's allocator has made so far (a first batch that finds no cached block makes some)."""
        return torch.cuda.memory_stats().get("segment.all.allocated", 0) if torch.cuda.is_available() else 0

    def encode(self, pixels):
        if pixels.shape[0] != self.batch_size or full[0] >= 4:
            return encode_image(self, pixels)
        full[0] += 1
        sync()
        segments = segments_made()
        begun = time.perf_counter()
        result = encode_image(self, pixels)
        launched = time.perf_counter()
        sync()
        rows.append({"step": f"full batch {full[0]} launched (graph kept: {self.image_graphs is not None})",
                     "from_ms": 1e3 * (begun - started), "ms": 1e3 * (launched - begun),
                     "done_ms": 1e3 * (time.perf_counter() - begun), "segments": segments_made() - segments})
        return result
    pipeline_module.EmbeddingPipeline._encode_image = encode
    out = Path(tempfile.mkdtemp(prefix="probe_job_start_"))
    try:
        summary = clip_flash.embed(args.photos, out / "out", args.model, repeat=args.repeat, progress=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rows.append({"step": "run (from the pipeline's start)", "from_ms": None, "ms": 1e3 * summary.seconds})
    table = markdown_table(("step", "from the start (ms)", "its thread (ms)", "device done (ms)",
                            "device memory segments made"),
                           [(row["step"], "-" if row["from_ms"] is None else f"{row['from_ms']:,.0f}",
                             f"{row['ms']:,.1f}", f"{row['done_ms']:,.1f}" if "done_ms" in row else "-",
                             str(row["segments"]) if "segments" in row else "-")
                            for row in rows])
    print(table)
    title = (f"The start of a fresh process's job, {args.model} exact, {summary.rows:,} photo files, image graph "
             f"capture {args.capture}; its first batch {summary.first_batch_seconds:.2f} s into the run.")
    write_microbenchmark(args.json, args.markdown, title, table.splitlines(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
