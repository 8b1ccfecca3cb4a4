#!/usr/bin/env python
"""The embedding job on one GPU and through Ray on every GPU of this machine: rates, and rows bit for bit.

    python benchmarks/bench_embed_ray.py --photos .device/photos --results DIR [--model ViT-L-14] [--repeat 150]

Runs ``clip_flash.embed`` (one GPU, the job ``scripts/embed.py`` runs) and ``clip_flash.jobs.ray_data.
embed_with_ray`` (a local Ray started here, one model actor per GPU) on the same files (the photo list
repeated ``--repeat`` times), exact image path, fp16 random-init weights, then checks that the two output
folders hold the same rows: every ``.npy`` shard equal byte for byte and every metadata table equal. Rates
count inputs per second from the model loaded to the end (the one-GPU job: its model loaded, so the decoder's
start, the warm-up and the run are inside; Ray: the first actor's model loaded, so the other actors' loads, every
warm-up and Ray's dispatch are inside), after the first shard of each, and with all setup (the call to its
return: Ray's actor processes importing torch and OpenCLIP and loading their models are inside, the one-GPU job's
imports are not: this script imported them first). Each actor's start is listed. Writes ``embed_ray.json`` and
``embed_ray.md`` under ``--results``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import open_clip  # noqa: E402,F401 - imported at the top, as a user's script does
import torch  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness.results import environment_record, markdown_table  # noqa: E402
from clip_flash.environment import usable_cores  # noqa: E402
from clip_flash.jobs.record import describe_actor  # noqa: E402

COLUMNS = ("run", "GPUs", "items", "failures", "model loaded after (s)", "items/s (from the model loaded)",
           "items/s (after the first shard)", "items/s (with setup)", "seconds (with setup)",
           "x one GPU (from the model loaded)", "x one GPU (with setup)")


def same_rows(out: Path, reference: Path) -> Dict[str, Any]:
    """Every shard file of ``reference`` present in ``out`` with equal contents (.npy arrays bit for bit,
    metadata tables equal)."""
    import pyarrow.parquet as pq

    checked, differing = 0, []
    for pattern in ("img_emb/*.npy", "text_emb/*.npy", "metadata/*.parquet"):
        for theirs in sorted(reference.glob(pattern)):
            ours = out / theirs.relative_to(reference)
            checked += 1
            if not ours.exists():
                differing.append(f"{ours.relative_to(out)} missing")
            elif theirs.suffix == ".npy":
                a, b = np.load(ours), np.load(theirs)
                if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
                    differing.append(str(ours.relative_to(out)))
            elif not pq.read_table(ours).equals(pq.read_table(theirs)):
                differing.append(str(ours.relative_to(out)))
    extra = [str(path.relative_to(out)) for pattern in ("img_emb/*.npy", "metadata/*.parquet")
             for path in out.glob(pattern) if not (reference / path.relative_to(out)).exists()]
    return {"files_checked": checked, "differing": differing, "extra": extra,
            "identical": checked > 0 and not differing and not extra}


def timed(call) -> Dict[str, Any]:
    started = time.perf_counter()
    summary = call()
    total = time.perf_counter() - started
    record = summary.to_dict()
    record["total_seconds"] = total
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True, help="folder of JPEG photos")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--repeat", type=int, default=150, help="times the photo list is embedded")
    parser.add_argument("--shard-size", type=int, default=2048)
    parser.add_argument("--actors", type=int, default=None, help="Ray model actors (default: one per GPU)")
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu only to smoke-test the script")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU here (use --device cpu only to smoke-test the script)", file=sys.stderr)
        return 2
    import ray

    from clip_flash.jobs.ray_data import embed_with_ray

    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    actors = args.actors or max(1, gpus)
    command = "python " + " ".join(shlex.quote(arg) for arg in [sys.argv[0], *(argv or sys.argv[1:])])
    scratch = Path(tempfile.mkdtemp(prefix="embed_ray_", dir=args.scratch))
    runs: List[Dict[str, Any]] = []
    try:
        one = scratch / "one-gpu"
        runs.append({"run": "clip_flash.embed", "gpus": 1, "summary": timed(lambda: clip_flash.embed(
            args.photos, one, args.model, device=device, repeat=args.repeat, shard_size=args.shard_size,
            progress=False))})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
        ray_out = scratch / "ray"
        runs.append({"run": f"embed_with_ray ({actors} actors)", "gpus": min(actors, gpus), "summary": timed(
            lambda: embed_with_ray(args.photos, ray_out, args.model, actors=actors, device=args.device,
                                   repeat=args.repeat, shard_size=args.shard_size, progress=False))})
        ray.shutdown()
        identical = same_rows(ray_out, one)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = runs[0]["summary"]
    rows = []
    for run in runs:
        summary = run["summary"]
        with_setup = summary["items"] / summary["total_seconds"]
        after_load = summary["after_load_items_per_s"] or 0.0
        rows.append({
            "run": run["run"], "GPUs": run["gpus"], "items": summary["items"], "failures": summary["failures"],
            "model loaded after (s)": f"{summary['model_load_seconds'] or 0:.1f}",
            "items/s (from the model loaded)": f"{after_load:,.0f}",
            "items/s (after the first shard)": f"{summary['steady_items_per_s'] or 0:,.0f}",
            "items/s (with setup)": f"{with_setup:,.0f}", "seconds (with setup)": f"{summary['total_seconds']:.1f}",
            "x one GPU (from the model loaded)": f"{after_load / (base['after_load_items_per_s'] or 1):.2f}",
            "x one GPU (with setup)": f"{with_setup / (base['items'] / base['total_seconds']):.2f}",
        })
    actor_lines = [f"- {run['run']}: actor {describe_actor(actor)}"
                   for run in runs for actor in run["summary"].get("actor_timeline") or []]
    record = {**environment_record(device, command), "cpu_cores": usable_cores(), "gpus": gpus,
              "ray": ray.__version__, "runs": runs, "rows": rows, "same_rows": identical}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "embed_ray.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    verdict = ("identical" if identical["identical"] else
               f"NOT identical: {identical['differing'][:5]} differ, {identical['extra'][:5]} extra")
    text = (f"<!-- command: {command} -->\n<!-- git: {record['git_revision']} -->\n"
            f"The embedding job, {args.model} exact, {runs[0]['summary']['precision']} random-init weights, "
            f"on `{record['device_name']}` x {gpus}, "
            f"{record['cpu_cores']} CPU cores, Ray {ray.__version__} (a local Ray started by the script). "
            f"From the model loaded: the one-GPU job from its model loaded (decoder start, warm-up and run "
            f"inside); Ray from the first actor's model loaded (the other actors' loads, every warm-up and Ray's "
            f"dispatch inside). With setup: the call to its return (Ray's actors importing torch and OpenCLIP "
            f"inside; the one-GPU job's imports are not: this script made them first).\n\n"
            + markdown_table(COLUMNS, [[str(row[c]) for c in COLUMNS] for row in rows])
            + "\n\n" + ("\n".join(actor_lines) + "\n\n" if actor_lines else "")
            + f"Rows: {identical['files_checked']} shard files compared, {verdict}.\n")
    (args.results / "embed_ray.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
