#!/usr/bin/env python
"""Where a request's milliseconds go inside the server: ``bench_serve.py`` run with every server process stamping
each hand-off (``handoff_hook/sitecustomize.py``), then, per request, each stamp's offset from its arrival.

    python benchmarks/serve/handoff_trace.py --out DIR -- --configs clip_flash --workloads image-raw --no-wrk \\
        --photos PHOTOS --rates 50 --duration 16 [--server-args "--workers 1"]
    python benchmarks/serve/handoff_trace.py --analyze DIR/stamps      # the table again, from kept stamps

Everything after ``--`` goes to ``bench_serve.py`` (its ``--results`` is DIR/bench). The table (DIR/handoffs.txt
and .json) takes the requests that arrived alone (no other arrival within ``--isolation-ms`` either side), so a
request's stamps are told apart from its neighbours' by time alone, drops the first tenth (warm-up) and gives each
stamp's median and p90 offset from ``arrive`` and the median step from the stamp before. Meant for low rates: at
50 req/s about a fifth of the requests arrive alone.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HOOK = Path(__file__).resolve().parent / "handoff_hook"
BENCH = Path(__file__).resolve().parent / "bench_serve.py"


Stamp = Tuple[float, str, Optional[float]]  # (time, label, the stamping thread's CPU time or None)
CPU = "cpu:"  # a request's key for a label's thread CPU time (beside the label's offset)


def load_stamps(folder: Path) -> List[Stamp]:
    """Every process's stamps, as (time, label, thread CPU time or None), in time order."""
    stamps: List[Stamp] = []
    for path in sorted(folder.glob("stamps_*.jsonl")):
        for entry in map(json.loads, path.read_text().splitlines()):
            stamps.append((entry[1], entry[0], entry[2] if len(entry) > 2 else None))
    for path in sorted(folder.glob("stamps_*.json")):  # one list per process, as traces made before were kept
        stamps += [(when, label, None) for label, when in json.loads(path.read_text())]
    stamps.sort(key=lambda stamp: stamp[:2])
    return stamps


def isolated_requests(stamps: Sequence[Sequence], isolation_s: float) -> Tuple[List[Dict[str, float]], int]:
    """Per request that arrived alone: each label's first offset (seconds) from its ``arrive`` (and, under
    ``cpu:LABEL``, the stamping thread's CPU time then, where the stamp has it); and how many requests arrived in
    all. ``stamps``: (time, label[, thread CPU time]) in time order."""
    arrivals = [stamp[0] for stamp in stamps if stamp[1] == "arrive"]
    requests = []
    position = 0
    for number, start in enumerate(arrivals):
        before = arrivals[number - 1] if number else float("-inf")
        after = arrivals[number + 1] if number + 1 < len(arrivals) else float("inf")
        if start - before < isolation_s or after - start < isolation_s:
            continue
        while stamps[position][0] < start:
            position += 1
        offsets: Dict[str, float] = {}
        for stamp in stamps[position:]:
            when, label = stamp[0], stamp[1]
            if when >= after:
                break
            if label not in offsets:
                offsets[label] = when - start
                if len(stamp) > 2 and stamp[2] is not None:
                    offsets[CPU + label] = stamp[2]
        requests.append(offsets)
    return requests[len(requests) // 10:], len(arrivals)


def handoff_table(requests: List[Dict[str, float]]) -> List[Dict[str, float]]:
    """Per label, in order of median offset: how many requests have it, its median and p90 offset (ms), the
    median step from the label before, and for a call's end (``X1`` after ``X0``, stamped by one thread) the
    median CPU time that thread spent in the call (``call_cpu_ms``; None where unknown): a call much longer than
    its CPU time waited (for the GIL, a core, the device)."""
    labels = {label for request in requests for label in request if not label.startswith(CPU)}
    medians = {label: statistics.median(request[label] for request in requests if label in request)
               for label in labels}
    rows, previous = [], 0.0
    for label in sorted(labels, key=medians.get):
        offsets = sorted(1e3 * request[label] for request in requests if label in request)
        median = 1e3 * medians[label]
        start = label[:-1] + "0" if label.endswith("1") else None
        cpu = [1e3 * (request[CPU + label] - request[CPU + start]) for request in requests
               if start and CPU + label in request and CPU + start in request]
        rows.append({"stamp": label, "requests": len(offsets), "median_ms": median,
                     "p90_ms": offsets[int(0.9 * (len(offsets) - 1))], "step_ms": median - previous,
                     "call_cpu_ms": statistics.median(cpu) if cpu else None})
        previous = median
    return rows


def render(rows: List[Dict[str, float]], isolated: int, arrived: int) -> str:
    lines = [f"{isolated} requests that arrived alone (of {arrived}); offsets from arrival in the app; call cpu: "
             "the thread's CPU time from X0 to X1",
             f"{'stamp':>18} {'requests':>8} {'median ms':>10} {'p90 ms':>8} {'step ms':>8} {'call cpu ms':>11}"]
    lines += [f"{row['stamp']:>18} {row['requests']:8d} {row['median_ms']:10.3f} {row['p90_ms']:8.3f} "
              f"{row['step_ms']:8.3f} "
              + (f"{row['call_cpu_ms']:11.3f}" if row.get("call_cpu_ms") is not None else f"{'':>11}")
              for row in rows]
    return "\n".join(lines)


def analyze(stamp_folder: Path, out: Path, isolation_ms: float) -> str:
    requests, arrived = isolated_requests(load_stamps(stamp_folder), isolation_ms / 1e3)
    if not requests:
        raise SystemExit(f"error: no request arrived alone in {stamp_folder} (a lower rate, or a smaller "
                         f"--isolation-ms)")
    rows = handoff_table(requests)
    text = render(rows, len(requests), arrived)
    out.mkdir(parents=True, exist_ok=True)
    (out / "handoffs.txt").write_text(text + "\n")
    (out / "handoffs.json").write_text(json.dumps({"isolated_requests": len(requests), "arrived": arrived,
                                                   "isolation_ms": isolation_ms, "stamps": rows}, indent=1))
    return text


def main(argv: Sequence[str] = ()) -> int:
    argv = list(argv or sys.argv[1:])
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                     usage="%(prog)s --out DIR -- BENCH_SERVE_ARGS | --analyze STAMPS_DIR")
    parser.add_argument("--out", type=Path, help="folder for the bench's results, the stamps and the table")
    parser.add_argument("--analyze", type=Path, help="a folder of stamps_*.jsonl: only the table (next to it)")
    parser.add_argument("--isolation-ms", type=float, default=15.0)
    args = parser.parse_args(own)
    if args.analyze:
        print(analyze(args.analyze, args.analyze.parent, args.isolation_ms))
        return 0
    if args.out is None or not bench_args:
        parser.error("--out DIR -- BENCH_SERVE_ARGS (or --analyze STAMPS_DIR)")
    stamps = args.out / "stamps"
    stamps.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CLIP_FLASH_TRACE_DIR=str(stamps),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(BENCH), *bench_args, "--results", str(args.out / "bench")], env=env)
    print(analyze(stamps, args.out, args.isolation_ms))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
