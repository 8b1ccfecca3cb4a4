#!/usr/bin/env python
"""Per-thread CPU of a running ``clip-flash serve``: once a second, for the engine process (``-m clip_flash.serve``)
and its spawned frontends, the thread count and each busy thread's CPU ticks (1/100 s) from ``/proc``, one JSON
line per process and second; with ``--py-spy``, a ``py-spy dump --native`` of the engine in a second where it used
more than ``--dump-above`` cores (blocking: the dump pauses the engine for a moment).

    python benchmarks/serve/sample_threads.py engine_threads.jsonl --seconds 95 --py-spy /path/to/py-spy

Start it with the server; it finds the processes as they appear. Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Dict, Tuple


def server_processes() -> Dict[int, str]:
    """pid -> "engine" (the ``clip_flash.serve`` process) or "child" (a spawned frontend)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "-m clip_flash.serve" in command:
            found[int(pid)] = "engine"
        elif "multiprocessing.spawn" in command:
            found[int(pid)] = "child"
    return found


def thread_ticks(pid: int) -> Dict[int, Tuple[str, int]]:
    """tid -> (name, user + system CPU ticks so far)."""
    rows = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return rows
    for tid in tids:
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        rows[int(tid)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]) + int(fields[12]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSON lines file to write")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--py-spy", default=None, help="py-spy executable: dump the engine's stacks when busy")
    parser.add_argument("--dump-above", type=float, default=4.0, help="cores the engine used in the last second")
    parser.add_argument("--max-dumps", type=int, default=12)
    args = parser.parse_args()
    end, last, dumps = time.time() + args.seconds, {}, 0
    with open(args.out, "w") as log:
        while time.time() < end:
            now_s = time.time()
            for pid, kind in server_processes().items():
                now, before = thread_ticks(pid), last.get(pid, {})
                delta = {tid: ticks - before.get(tid, (name, ticks))[1] for tid, (name, ticks) in now.items()}
                busy = sum(delta.values())
                hot = sorted(((ticks, tid, now[tid][0]) for tid, ticks in delta.items() if ticks > 20), reverse=True)
                log.write(json.dumps({"t": round(now_s, 2), "pid": pid, "kind": kind, "threads": len(now),
                                      "busy_ticks": busy, "hot": hot[:20]}) + "\n")
                last[pid] = now
                if (args.py_spy and kind == "engine" and before and busy > 100 * args.dump_above
                        and dumps < args.max_dumps):
                    dumps += 1
                    done = subprocess.run([args.py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True,
                                          text=True, timeout=30)
                    log.write(json.dumps({"t": round(now_s, 2), "pid": pid, "dump": done.stdout[-60000:],
                                          "err": done.stderr[-2000:]}) + "\n")
            log.flush()
            time.sleep(max(0.0, 1.0 - (time.time() - now_s)))


if __name__ == "__main__":
    main()
