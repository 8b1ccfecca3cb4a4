"""The engine bench drives the real engine process's socket end to end: every image request, each with a body of
its own, is answered. Run as a command, as it is meant to be: it replaces the engine's model loading with its
no-op model (``overhead_server.install``) in the process that runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _engine_rate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.serve.engine_rate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_image_requests_with_bodies_of_their_own_are_all_answered():
    done = _engine_rate("--rate", "200", "--seconds", "0.5", "--warmup", "0.3", "--workload", "image",
                        "--image-payloads", "4", "--connections", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["image_payloads"] == 4 and stats["refused"] == 0
    # answers counted in the window: those sent in it, give or take the few in flight at its ends
    assert stats["sent"] >= 50 and stats["answered"] >= 0.8 * stats["sent"]


def test_no_image_payload_is_refused():
    done = _engine_rate("--image-payloads", "0")
    assert done.returncode == 2 and "--image-payloads must be at least 1" in done.stderr
