"""Where each thread of this process spends its time: a sampling profiler for pipelines of threads.

Every ``interval`` seconds a background thread reads every thread's Python stack
(``sys._current_frames``) and counts, per thread name, the innermost frame and the stack below it. A thread
that is inside a call releasing the GIL (a CUDA synchronize, a queue wait, a process pool's result) is
seen at that call; a thread running Python is seen where it runs. The sampler itself needs the GIL, so
under contention it samples less often, never in a biased place: each sample is a full snapshot.

Also reads the machine's CPU time from ``/proc/stat`` at start and stop: how busy the cores were.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

Frame = Tuple[str, str, int]  # (file name, function, line)


def _cpu_times() -> Optional[Tuple[float, float]]:
    """(busy, total) jiffies of all cores, or None where ``/proc/stat`` does not exist."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(value) for value in stat.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class ThreadSampler:
    """``with ThreadSampler() as sampler: ...`` then ``sampler.report()``."""

    def __init__(self, interval: float = 0.002, depth: int = 8, package: str = "clip_flash") -> None:
        self.interval, self.depth, self.package = interval, depth, package
        self.samples: Dict[str, int] = collections.Counter()
        self.leaves: Dict[str, "collections.Counter[str]"] = collections.defaultdict(collections.Counter)
        self.stacks: Dict[str, "collections.Counter[str]"] = collections.defaultdict(collections.Counter)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cpu_start: Optional[Tuple[float, float]] = None
        self.cpu_busy_fraction: Optional[float] = None
        self.seconds = 0.0

    def _describe(self, frame: Any) -> List[Frame]:
        stack: List[Frame] = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, code.co_name, frame.f_lineno))
            frame = frame.f_back
        return stack  # innermost first

    def _short(self, frame: Frame) -> str:
        path, function, line = frame
        parts = path.replace(os.sep, "/").split("/")
        name = "/".join(parts[parts.index(self.package):]) if self.package in parts else parts[-1]
        return f"{name}:{function}:{line}"

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, f"thread-{ident}")
                if name.startswith("clip_flash-decode"):  # one row for the decode pool's threads
                    name = "clip_flash-decode (all)"
                stack = self._describe(frame)
                self.samples[name] += 1
                self.leaves[name][self._short(stack[0])] += 1
                self.stacks[name][" <- ".join(self._short(entry) for entry in stack[:self.depth])] += 1

    def __enter__(self) -> "ThreadSampler":
        self._cpu_start = _cpu_times()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True, name="clip_flash-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = time.perf_counter() - self._started
        end = _cpu_times()
        if self._cpu_start is not None and end is not None and end[1] > self._cpu_start[1]:
            self.cpu_busy_fraction = (end[0] - self._cpu_start[0]) / (end[1] - self._cpu_start[1])

    def report(self, top: int = 8) -> Dict[str, Any]:
        """Per thread: samples, and the most sampled innermost frames and stacks with their shares."""
        threads = {}
        for name, count in sorted(self.samples.items(), key=lambda kv: -kv[1]):
            threads[name] = {
                "samples": count,
                "leaves": [(leaf, hits / count) for leaf, hits in self.leaves[name].most_common(top)],
                "stacks": [(stack, hits / count) for stack, hits in self.stacks[name].most_common(top)],
            }
        return {"seconds": self.seconds, "interval_s": self.interval, "cpu_busy_fraction": self.cpu_busy_fraction,
                "cpu_cores": os.cpu_count(), "threads": threads}


def format_report(report: Dict[str, Any], threads: Optional[List[str]] = None) -> str:
    """The report as text: one block per thread (all, or those named)."""
    busy = report["cpu_busy_fraction"]
    lines = [f"{report['seconds']:.1f} s sampled every {1e3 * report['interval_s']:.0f} ms; machine CPU busy "
             + (f"{100 * busy:.0f}% of {report['cpu_cores']} cores" if busy is not None else "unknown")]
    for name, data in report["threads"].items():
        if threads is not None and name not in threads:
            continue
        lines.append(f"\n[{name}] {data['samples']} samples")
        lines.append("  innermost frames:")
        lines += [f"    {100 * share:5.1f}%  {leaf}" for leaf, share in data["leaves"]]
        lines.append("  stacks (innermost first):")
        lines += [f"    {100 * share:5.1f}%  {stack}" for stack, share in data["stacks"]]
    return "\n".join(lines)
