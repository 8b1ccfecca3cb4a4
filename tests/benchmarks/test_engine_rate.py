"""The engine bench drives the real engine process's socket end to end: every image request, each with a body of
its own, is answered."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.serve import engine_rate  # noqa: E402


def test_image_requests_with_bodies_of_their_own_are_all_answered(capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the driver process imports benchmarks from here
    assert engine_rate.main(["--rate", "200", "--seconds", "0.5", "--warmup", "0.3", "--workload", "image",
                             "--image-payloads", "4", "--connections", "1"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["image_payloads"] == 4 and stats["refused"] == 0
    # answers counted in the window: those sent in it, give or take the few in flight at its ends
    assert stats["sent"] >= 50 and stats["answered"] >= 0.8 * stats["sent"]


def test_no_image_payload_is_refused():
    with pytest.raises(SystemExit):
        engine_rate.main(["--image-payloads", "0"])
