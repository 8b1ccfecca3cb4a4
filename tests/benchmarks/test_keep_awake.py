"""``keep_awake.py``: its spinners run at SCHED_IDLE and leave with it on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve" / "keep_awake.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and /proc: Linux")


def children_of(pid: int) -> list:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def test_spinners_run_at_sched_idle_and_stop_on_sigterm():
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--processes", "2", "--seconds", "60"],
                               stdout=subprocess.PIPE, text=True)
    spinners = []
    try:
        assert "2 SCHED_IDLE spinners" in process.stdout.readline()
        spinners = children_of(process.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                len(spinners) >= 2 and all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in spinners)):
            time.sleep(0.05)
            spinners = children_of(process.pid)
        assert len(spinners) == 2 and {os.sched_getscheduler(pid) for pid in spinners} == {os.SCHED_IDLE}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        time.sleep(0.2)
        assert not [pid for pid in spinners if alive(pid)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in spinners:  # a failure leaves no spinner behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_spinners_leave_when_their_parent_is_killed_outright():
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--processes", "2", "--seconds", "60"],
                               stdout=subprocess.PIPE, text=True)
    assert "2 SCHED_IDLE spinners" in process.stdout.readline()
    spinners = children_of(process.pid)
    process.kill()  # no handler runs: the spinners see their parent gone
    process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in spinners):
        time.sleep(0.05)
    leftover = [pid for pid in spinners if alive(pid)]
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert spinners and not leftover


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
