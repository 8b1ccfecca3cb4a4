#!/usr/bin/env python
"""What making page-locked host memory costs on this machine, and what it holds up while it runs.

    python benchmarks/probe_pinned_host.py --results DIR

A batch's decoded pixels and JPEG coefficients live in page-locked host blocks from torch's allocator (rounded
to a power of two, cached once freed): the first batches of a run make them, later ones reuse them. Each case
runs in a fresh process (a warm allocator would hide the cost):

- ``alone``: blocks of 16-512 MiB made one after another; milliseconds each and GB/s.
- ``beside-gpu``: the same while the main thread keeps a GPU busy with small launches and a sync every 20, as a
  job's launching thread does: how much longer each launch-and-sync round takes while blocks are being made
  (a driver lock held by the allocation shows as rounds as long as an allocation).
- ``register``: the ``alone`` case with torch's ``pinned_use_cuda_host_register`` (malloc, then
  ``cudaHostRegister`` from 8 threads) instead of ``cudaHostAlloc``.

Writes ``pinned_host.json`` and ``pinned_host.md`` under ``--results``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES_MIB = (16, 64, 256, 512)
BLOCKS_PER_SIZE = 3


def _make_blocks(sizes_mib: Sequence[int], count: int) -> List[Dict[str, float]]:
    import torch

    kept, rows = [], []
    for size in sizes_mib:
        for _ in range(count):
            started = time.perf_counter()
            kept.append(torch.empty(size << 20, dtype=torch.uint8, pin_memory=True))
            seconds = time.perf_counter() - started
            rows.append({"mib": size, "ms": seconds * 1e3, "gb_per_s": (size << 20) / seconds / 1e9})
    return rows


def case_alone(register: bool) -> Dict[str, Any]:
    import torch

    if register:
        torch.cuda.memory._set_allocator_settings("pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return {"blocks": _make_blocks(SIZES_MIB, BLOCKS_PER_SIZE)}


def case_beside_gpu() -> Dict[str, Any]:
    import torch

    x = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()

    def rounds(seconds: float) -> List[float]:
        out, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            for _ in range(20):
                torch.mm(x, x)
            torch.cuda.synchronize()
            out.append((time.perf_counter() - started) * 1e3)
        return out

    rounds(0.5)
    quiet = rounds(1.0)
    made: List[Dict[str, float]] = []
    allocating = threading.Thread(target=lambda: made.extend(_make_blocks((256,), 4)))
    busy: List[float] = []
    allocating.start()
    while allocating.is_alive():
        busy.extend(rounds(0.05))
    allocating.join()

    def summary(values: List[float]) -> Dict[str, float]:
        return {"rounds": len(values), "median_ms": statistics.median(values), "max_ms": max(values)}

    return {"quiet": summary(quiet), "while_allocating": summary(busy), "blocks": made}


def run_case(name: str) -> Dict[str, Any]:
    """``name`` in a fresh process; its JSON result."""
    output = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, check=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


def render(results: Dict[str, Any]) -> str:
    lines = [f"<!-- command: {results['command']} -->", f"<!-- git: {results['git_revision']} -->",
             f"Page-locked host blocks from torch's allocator on `{results['device_name']}` "
             f"(torch {results['clip_flash_environment'].get('torch')}), each case in a fresh process.", "",
             "| case | block MiB | ms per block (median of 3) | GB/s |", "|---|---|---|---|"]
    for case in ("alone", "register"):
        for size in SIZES_MIB:
            blocks = [b for b in results[case]["blocks"] if b["mib"] == size]
            ms = statistics.median(b["ms"] for b in blocks)
            lines.append(f"| {case} | {size} | {ms:.1f} | {(size << 20) / ms / 1e6:.2f} |")
    beside = results["beside-gpu"]
    lines += ["", "Launch-and-sync rounds (20 small GEMMs, then a sync) on the main thread:", "",
              "| while | rounds | median ms | max ms |", "|---|---|---|---|"]
    for key, label in (("quiet", "nothing else"), ("while_allocating", "another thread makes 4 x 256 MiB")):
        row = beside[key]
        lines.append(f"| {label} | {row['rounds']} | {row['median_ms']:.2f} | {row['max_ms']:.2f} |")
    made = ", ".join(f"{b['ms']:.0f}" for b in beside["blocks"])
    lines.append(f"\nThe 256 MiB blocks made meanwhile took {made} ms.")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path)
    parser.add_argument("--case", choices=("alone", "register", "beside-gpu"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        result = case_beside_gpu() if args.case == "beside-gpu" else case_alone(args.case == "register")
        print(json.dumps(result))
        return 0
    if args.results is None:
        parser.error("--results is required")
    import torch

    from benchmarks.harness.results import environment_record

    command = "python " + " ".join(shlex.quote(arg) for arg in [sys.argv[0], *(argv or sys.argv[1:])])
    results = {**environment_record(torch.device("cuda"), command)}
    for name in ("alone", "register", "beside-gpu"):
        results[name] = run_case(name)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "pinned_host.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = render(results)
    (args.results / "pinned_host.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
