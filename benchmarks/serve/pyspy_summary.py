#!/usr/bin/env python
"""Per-thread summary of ``py-spy record --threads --format raw`` files of one process: for each thread, its samples
(a share of the window: ``--rate`` x ``--seconds`` samples were it always counted) and the stacks that took most,
cut to the frames below the first of ``--below`` they pass through (else their last ``--depth`` frames).

Record the same process twice at once, once with ``--gil`` (samples of the thread holding the GIL), once without
(samples of threads on a core), and pass both: where a thread's time goes, and how much of it held the GIL.

    python benchmarks/serve/pyspy_summary.py busy.txt gil.txt --rate 250 --seconds 8 \
        --below TowerBatcher._collect EngineServer._run
"""
from __future__ import annotations

import argparse
import collections
from typing import Dict, List, Sequence


def read_raw(path: str) -> List[tuple]:
    """``[(thread, [frame names]), samples]`` rows of a raw file (``thread (tid): name;frame (file:line);... N``)."""
    rows = []
    with open(path) as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            rows.append((frames[0], [frame.split(" (")[0] for frame in frames[1:]], int(count)))
    return rows


def summarize(rows: List[tuple], window: float, below: Sequence[str], depth: int, top: int) -> List[str]:
    threads: Dict[str, int] = collections.Counter()
    stacks: Dict[str, Dict[str, int]] = collections.defaultdict(collections.Counter)
    for thread, frames, count in rows:
        threads[thread] += count
        cut = next((position + 1 for position, frame in enumerate(frames) if frame in below), None)
        key = frames[cut:cut + depth] if cut is not None else frames[-depth:]
        stacks[thread][";".join(key) or "(the frame itself)"] += count
    out = []
    for thread, count in threads.most_common():
        out.append(f"- {thread}: {count} samples ({100 * count / window:.0f}% of the window)")
        for stack, samples in stacks[thread].most_common(top):
            out.append(f"    - {samples:6d}  {stack}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="raw py-spy files (e.g. one recorded without and one with --gil)")
    parser.add_argument("--rate", type=float, required=True, help="the recording's samples per second")
    parser.add_argument("--seconds", type=float, required=True, help="the recording's duration")
    parser.add_argument("--below", nargs="*", default=(), help="frames under which stacks are grouped")
    parser.add_argument("--depth", type=int, default=3, help="frames kept of each stack")
    parser.add_argument("--top", type=int, default=10, help="stacks shown per thread")
    args = parser.parse_args()
    window = args.rate * args.seconds
    for path in args.files:
        print(f"## {path}\n")
        print("\n".join(summarize(read_raw(path), window, args.below, args.depth, args.top)))
        print()


if __name__ == "__main__":
    main()
