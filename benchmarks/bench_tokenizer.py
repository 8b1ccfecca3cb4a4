#!/usr/bin/env python
"""Captions/s of OpenCLIP's tokenizer and clip_flash's, on real caption sets, with all cores and with one.

    PYTHONPATH=. python benchmarks/bench_tokenizer.py --json benchmarks/results/cpu-2core/tokenizer.json \
        --markdown benchmarks/results/cpu-2core/tokenizer.md

Each core setting runs in its own process (rayon sizes its pool once per process): ``all`` leaves the
process on every core this process may use; ``1`` pins it to one core and sets RAYON_NUM_THREADS=1.
Per caption set: the first call of a fresh tokenizer ("cold": nothing cached, what a one-off job pays),
then the two tokenizers alternate, median over ``--repeats`` calls each ("warm"). Ids are compared with
``torch.equal`` on every set; a difference fails the run.

"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


STAGE_ORDER = ["find plain texts", "replay ftfy cleaning", "cut chunks", "chunk ids", "fill rows",
               "OpenCLIP cleaning (replay refused)"]


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def measure(model: str, captions: int, repeats: int, seed: int) -> List[Dict[str, Any]]:
    """This process's rows: one per caption set."""
    import open_clip
    import torch

    from benchmarks.harness.captions import CAPTION_SETS
    from clip_flash.inputs.text.tokenizer import get_tokenizer

    rows = []
    for set_name, make in CAPTION_SETS.items():
        texts = make(captions, seed)
        openclip_tok = open_clip.get_tokenizer(model)
        started = time.perf_counter()
        expected = openclip_tok(texts)
        openclip_cold = time.perf_counter() - started
        started = time.perf_counter()
        ours = get_tokenizer(model)
        built = time.perf_counter()
        got = ours(texts)
        ours_cold = time.perf_counter() - built
        ours_build = built - started
        if not torch.equal(got, expected):
            raise SystemExit(f"ids differ on the {set_name} set: refusing to time a wrong tokenizer")
        calls = {"openclip": lambda: openclip_tok(texts), "clip_flash": lambda: ours(texts)}
        seconds: Dict[str, List[float]] = {side: [] for side in calls}
        for side in calls:  # one untimed warm call each
            if not torch.equal(calls[side](), expected):
                raise SystemExit(f"{side} ids differ on the {set_name} set")
        ours.stage_seconds.clear()  # stages of the warm calls only
        for repeat in range(repeats):
            for side in (list(calls) if repeat % 2 == 0 else list(calls)[::-1]):
                started = time.perf_counter()
                calls[side]()
                seconds[side].append(time.perf_counter() - started)
        openclip_warm = statistics.median(seconds["openclip"])
        ours_warm = statistics.median(seconds["clip_flash"])
        rows.append({
            "caption_set": set_name, "captions": len(texts),
            "mean_tokens": float((expected != 0).sum()) / len(texts),
            "openclip_cold_per_s": len(texts) / openclip_cold, "clip_flash_cold_per_s": len(texts) / ours_cold,
            "cold_speedup": openclip_cold / ours_cold, "clip_flash_build_s": ours_build,
            "openclip_warm_per_s": len(texts) / openclip_warm, "clip_flash_warm_per_s": len(texts) / ours_warm,
            "warm_speedup": openclip_warm / ours_warm,
            "openclip_seconds": seconds["openclip"], "clip_flash_seconds": seconds["clip_flash"],
            "routes": dict(ours.route_counts), "ids_identical": True,
            "clip_flash_stage_ms_per_call": {stage: 1e3 * total / repeats
                                             for stage, total in ours.stage_seconds.items()},
        })
    return rows


def run_setting(cores: str, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Rows measured in a child process restricted to ``cores`` ("all" or "1")."""
    env = dict(os.environ)
    command = [sys.executable, __file__, "--worker", "--model", args.model, "--captions", str(args.captions),
               "--repeats", str(args.repeats), "--seed", str(args.seed)]
    if cores == "1":
        env["RAYON_NUM_THREADS"] = "1"
        command.append("--pin-one-core")
    else:
        env.pop("RAYON_NUM_THREADS", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker ({cores} cores) failed:\n{done.stderr}")
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    count = 1 if cores == "1" else usable_cores()
    return [{**row, "cores": count} for row in rows]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--captions", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", nargs="+", choices=("all", "1"), default=["all", "1"])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pin-one-core", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        if args.pin_one_core and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(json.dumps(measure(args.model, args.captions, args.repeats, args.seed)))
        return 0

    from benchmarks.harness.results import markdown_table, write_microbenchmark

    load_before = os.getloadavg()
    rows = [row for cores in args.cores for row in run_setting(cores, args)]
    columns = ("captions", "cores", "mean tokens", "OpenCLIP warm /s", "clip_flash warm /s", "warm x",
               "OpenCLIP cold /s",
               "clip_flash cold /s", "cold x",
               "texts per route over all calls (plain/replayed/cleaned/openclip)")
    table = markdown_table(columns, [(
        f"{row['caption_set']} x{row['captions']}", str(row["cores"]), f"{row['mean_tokens']:.1f}",
        f"{row['openclip_warm_per_s']:,.0f}", f"{row['clip_flash_warm_per_s']:,.0f}", f"{row['warm_speedup']:.1f}",
        f"{row['openclip_cold_per_s']:,.0f}", f"{row['clip_flash_cold_per_s']:,.0f}", f"{row['cold_speedup']:.1f}",
        "/".join(str(count) for count in row["routes"].values()),
    ) for row in rows])
    stages = sorted({stage for row in rows for stage in row["clip_flash_stage_ms_per_call"]},
                    key=lambda stage: STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER))
    stage_table = markdown_table(("captions", "cores") + tuple(f"{stage} ms" for stage in stages) + ("sum ms",), [(
        f"{row['caption_set']} x{row['captions']}", str(row["cores"]),
        *(f"{row['clip_flash_stage_ms_per_call'].get(stage, 0.0):.2f}" for stage in stages),
        f"{sum(row['clip_flash_stage_ms_per_call'].values()):.2f}") for row in rows])
    print(table)
    print(stage_table)
    title = (f"Tokenizer throughput, `{args.model}`: OpenCLIP's `get_tokenizer` vs `clip_flash.get_tokenizer`, "
             f"{args.captions} captions per call; warm = median of {args.repeats} alternating calls; cold = "
             f"first call of a freshly built tokenizer (building it, ~0.3-0.5 s once, is not counted: see the "
             f"JSON); ids identical "
             f"(torch.equal) on every set. Host: {usable_cores()} usable cores, load average "
             f"{load_before[0]:.1f} before / {os.getloadavg()[0]:.1f} after the run (other work shares the host "
             f"when it is above 0).")
    stage_note = ("Where clip_flash's warm call spends its time in the calling process (ms per call of "
                  f"{args.captions} captions, mean over the {args.repeats} warm calls):")
    write_microbenchmark(args.json, args.markdown, title, table.splitlines() + ["", stage_note, ""]
                         + stage_table.splitlines(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
