#!/usr/bin/env python
"""Keep this host's cores out of their idle state while a benchmark runs: one spinning process per core at
``SCHED_IDLE`` (any runnable thread preempts it at once), and optionally a 0 us request on ``/dev/cpu_dma_latency``
(PM QoS: no deep C-states; needs write access). What a lone request costs when every thread it passes through
wakes on an idle core, against cores kept busy.

    python benchmarks/serve/keep_awake.py --processes 16 --seconds 120 &

Runs until ``--seconds`` pass or SIGTERM; prints what it set up. Linux only.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import struct
import sys
import time


def spin(parent: int) -> None:
    """Spin at SCHED_IDLE until the parent is gone (a parent killed outright leaves no one to stop its spinners)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: terminate() ends a spinner at once
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while os.getppid() == parent:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="spinning processes (0: none)")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--dma-latency", action="store_true", help="also hold a 0 us /dev/cpu_dma_latency request")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # before anything is started: the finally below stops it
    held = None
    if args.dma_latency:
        try:
            held = open("/dev/cpu_dma_latency", "wb", buffering=0)
            held.write(struct.pack("i", 0))
            print("holding /dev/cpu_dma_latency at 0 us", flush=True)
        except OSError as error:
            print(f"/dev/cpu_dma_latency not set: {error}", flush=True)
    fork = multiprocessing.get_context("fork")  # children of this process, whatever the platform's default
    spinners = []
    try:
        for _ in range(args.processes):
            spinners.append(fork.Process(target=spin, args=(os.getpid(),), daemon=True))
            spinners[-1].start()
        print(f"{len(spinners)} SCHED_IDLE spinners for up to {args.seconds:g} s", flush=True)
        time.sleep(args.seconds)
    finally:
        for spinner in spinners:
            spinner.terminate()
        if held is not None:
            held.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
