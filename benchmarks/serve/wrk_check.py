"""Closed-loop peak throughput on the raw-image route with Debian's ``wrk``: the cross-check of the open-loop
curve's top. ``wrk`` keeps every connection busy (send, wait, send), so its rate is the server's ceiling
under that concurrency; its latencies are closed-loop and not comparable with the open-loop percentiles."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional

SCRIPT = Path(__file__).resolve().with_name("post_jpeg.lua")


def find_wrk(explicit: Optional[str]) -> Optional[str]:
    """The wrk binary: ``explicit``, else ``.device/bin/wrk`` under the repository, else ``wrk`` on PATH."""
    if explicit:
        return explicit
    carried = Path(__file__).resolve().parents[2] / ".device" / "bin" / "wrk"
    if carried.exists():
        return str(carried)
    return shutil.which("wrk")


def run_wrk(wrk: str, url: str, jpeg_path: Path, threads: int, connections: int, duration_s: int) -> Dict[str, object]:
    """Run wrk against ``url`` posting ``jpeg_path``; requests/s, latency percentiles (ms), errors."""
    env = dict(os.environ)
    lib = Path(wrk).resolve().parent.parent / "lib"
    if lib.is_dir():  # the carried wrk finds its LuaJIT there
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
    command = [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--timeout", "30s", "-s", str(SCRIPT),
               url, "--", str(jpeg_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=duration_s + 60)
    line = next((line for line in done.stdout.splitlines() if line.startswith("wrk-json ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    summary = json.loads(line[len("wrk-json "):])
    seconds = summary["duration_us"] / 1e6
    errors = {kind: count for kind, count in summary["errors"].items() if count}
    return {
        "command": " ".join(command),
        "threads": threads, "connections": connections, "duration_s": round(seconds, 3),
        "requests": summary["requests"],
        "requests_per_s": round(summary["requests"] / seconds, 2),
        # wrk counts non-2xx/3xx answers as "status" errors; those are not successful embeddings
        "ok_per_s": round((summary["requests"] - summary["errors"]["status"]) / seconds, 2),
        "errors": errors,
        "latency_ms": {key: value / 1000.0 for key, value in summary["latency_us"].items()},
    }
