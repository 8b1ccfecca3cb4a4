"""Stopping a job from outside: Ctrl-C and SIGTERM end it with one line and an exit status that says so, and
nothing the job started (decoding workers, a fork server, a resource tracker) outlives it, even after SIGKILL;
the same command then resumes it, every input exactly once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Set

import pytest

from clip_flash.jobs.cli import stopped_message
from clip_flash.inputs.image.native_decode import NativeBatchDecoder
from clip_flash.jobs.job import EXECUTORS
from tests.utils import child_env
from .job_helpers import MODEL, write_photos
from .test_job_resume import assert_exactly_once, done_shards

REPO = Path(__file__).resolve().parents[2]
# Every executor the job has that runs here ("native" needs the built extension): decoding runs in the job's own
# threads (native or Python), so nothing it started can outlive it.
JOB_EXECUTORS = [executor for executor in EXECUTORS if executor != "native" or NativeBatchDecoder.create(1)]
SIGKILL_CASES = JOB_EXECUTORS


def _stat_fields(pid: int):
    """(state, ppid, session) of a process, or None once it is gone (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    state, ppid, session = fields[0], int(fields[1]), int(fields[3])
    return None if state in ("Z", "X") else (state, ppid, session)


def descendants(root: int) -> Set[int]:
    """Every live process below ``root`` (by parent) or in its session (the job is a session leader)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                table[int(entry)] = fields
    found = {pid for pid, (_, _, session) in table.items() if session == root and pid != root}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (_, ppid, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def start_job(tmp_path: Path, executor: str, count: int = 8) -> subprocess.Popen:
    """The job on ``count`` photos in shards of 2, as a terminal's foreground job: SIGINT at its default action
    (a shell's background list, e.g. a CI script started with ``&``, hands its children SIGINT ignored, and a
    program started so rightly keeps ignoring Ctrl-C)."""
    photos = tmp_path / "photos"
    if not photos.exists():
        write_photos(photos, count=count, captions=False)
    command = [sys.executable, str(REPO / "scripts" / "embed.py"), "--model", MODEL, "--device", "cpu",
               "--input", str(photos), "--out", str(tmp_path / "out"), "--shard-size", "2", "--batch-size", "1",
               "--workers", "2", "--executor", executor, "--no-progress"]
    env = child_env(OMP_NUM_THREADS="1")
    # its own session: what it starts can be found by session id even after it is reparented
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_a_shard(process: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 240
    while not (out.exists() and done_shards(out)):
        assert process.poll() is None, "the job ended before its first shard: " + process.communicate()[1]
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.02)


def assert_nothing_outlives(process: subprocess.Popen, started: Set[int]) -> str:
    """The job's pipes close (no survivor holds them) and no process it started is alive; returns stderr."""
    try:
        _, stderr = process.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        stderr = "(stderr still open)"
    deadline = time.monotonic() + 3
    alive = {pid for pid in started | descendants(process.pid) if _stat_fields(pid) is not None}
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {pid for pid in alive if _stat_fields(pid) is not None}
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in alive
                if Path(f"/proc/{pid}/cmdline").exists()}
    for pid in alive:  # the test's own leftovers, by id
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert stderr != "(stderr still open)", f"the job's stdout/stderr stayed open after it ended: {commands}"
    assert not alive, f"processes the job started outlived it: {commands}"
    return stderr


@pytest.mark.parametrize("executor", SIGKILL_CASES)
def test_sigkill_leaves_no_process_behind(tmp_path, executor):
    process = start_job(tmp_path, executor)
    wait_for_a_shard(process, tmp_path / "out")
    started = descendants(process.pid)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert_nothing_outlives(process, started)


@pytest.mark.parametrize("stop, executor", [(signal.SIGINT, "thread"), (signal.SIGTERM, JOB_EXECUTORS[-1])])
def test_ctrl_c_and_sigterm_stop_with_one_line_then_the_same_command_resumes(tmp_path, stop, executor):
    process = start_job(tmp_path, executor)
    wait_for_a_shard(process, tmp_path / "out")
    started = descendants(process.pid)
    if stop == signal.SIGINT:
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    else:
        process.send_signal(stop)
    process.wait(timeout=60)
    stderr = assert_nothing_outlives(process, started)
    assert process.returncode == 128 + stop, stderr
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr and last == stopped_message(tmp_path / "out"), stderr
    assert last.startswith("stopped with ") and not last.startswith("stopped with 0 "), stderr  # a shard was done
    if stop != signal.SIGINT:
        return  # resuming is the same after either (and after SIGKILL: test_job_resume.py)
    resumed = start_job(tmp_path, executor)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert_exactly_once(tmp_path / "out", sorted((tmp_path / "photos").rglob("photo_*")))
