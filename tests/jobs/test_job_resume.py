"""Resuming: a job stopped anywhere and started again ends with every input exactly once, finished shards
untouched; a folder from other settings or inputs is refused; disk errors lose no finished shard."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import clip_flash
from clip_flash.jobs import OutputError, SettingsMismatchError
from clip_flash.jobs.writer import InputChangedError
from clip_flash.jobs import writer as writer_module
from tests.utils import child_env
from .job_helpers import MODEL, read_output, write_photos

REPO = Path(__file__).resolve().parents[2]


def finished_files(out: Path) -> dict:
    """Every committed shard file -> (sha256, mtime_ns, inode): what "untouched" means."""
    files = {}
    for folder in ("img_emb", "text_emb", "metadata", "_clip_flash/done", "_clip_flash/failures"):
        for path in sorted((out / folder).glob("*")):
            stat = path.stat()
            files[str(path.relative_to(out))] = (hashlib.sha256(path.read_bytes()).hexdigest(), stat.st_mtime_ns,
                                                 stat.st_ino)
    return files


def done_shards(out: Path) -> set:
    return {path.stem for path in (out / "_clip_flash" / "done").glob("*.json")}


def assert_exactly_once(out: Path, inputs) -> None:
    output = read_output(out)
    seen = Counter(output["metadata"]["image_path"]) + Counter(row["path"] for row in output["failures"])
    assert seen == Counter(str(path) for path in inputs)
    assert output["img_emb"].shape[0] == len(output["metadata"]["image_path"])
    assert not list(out.rglob("*.tmp"))


def test_failure_between_shards_then_resume(tmp_path, checkpoint, monkeypatch):
    inputs = write_photos(tmp_path / "photos", count=7)
    out = tmp_path / "out"
    real_write = writer_module.OutputFolder.write
    calls = []

    def crash_after_three(self, result):
        if len(calls) == 3:
            raise RuntimeError("injected crash between shards")
        calls.append(result.index)
        real_write(self, result)

    monkeypatch.setattr(writer_module.OutputFolder, "write", crash_after_three)
    with pytest.raises(RuntimeError, match="injected"):
        clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                         batch_size=1, progress=False)
    monkeypatch.setattr(writer_module.OutputFolder, "write", real_write)
    assert done_shards(out) == {"0", "1", "2"}
    before = finished_files(out)
    # what a kill in the middle of shard 3's commit leaves: a renamed file and a temporary, no marker
    (out / "img_emb" / "img_emb_3.npy").write_bytes(b"half-written")
    (out / "metadata" / "metadata_3.parquet.tmp").write_bytes(b"half-written")

    summary = clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                               batch_size=1, progress=False)
    assert (summary.shards_skipped, summary.shards_written, summary.rows) == (3, 1, 1)
    after = finished_files(out)
    assert {name: after[name] for name in before} == before
    assert_exactly_once(out, inputs)
    assert read_output(out)["img_emb"].shape == (7, 384)


def test_killed_subprocess_at_random_points_resumes_exactly_once(tmp_path):
    """SIGKILL ``scripts/embed.py`` at random moments after some shards committed, twice; the third run
    finishes; every input is there once and each shard finished before a kill is byte-for-byte unchanged."""
    inputs = write_photos(tmp_path / "photos", count=12, captions=False)
    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "scripts" / "embed.py"), "--model", MODEL, "--device", "cpu",
               "--input", str(tmp_path / "photos"), "--out", str(out), "--shard-size", "1", "--batch-size", "1",
               "--no-progress"]
    env = child_env(OMP_NUM_THREADS="1")
    seed = int(os.environ.get("CLIP_FLASH_TEST_SEED") or random.randrange(1 << 30))  # kill points differ per run
    rng = random.Random(seed)
    again = f"(rerun these kill points with CLIP_FLASH_TEST_SEED={seed})"
    snapshots, killed_running = [], 0
    for kill_after in (rng.randint(1, 3), rng.randint(1, 3)):
        already = len(done_shards(out)) if out.exists() else 0
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while (not out.exists() or len(done_shards(out)) < already + kill_after) and process.poll() is None:
            assert time.monotonic() < deadline, "the job made no progress"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))  # land anywhere: mid-batch, mid-commit, between shards
        killed_running += process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait()
        snapshots.append(finished_files(out))
    assert killed_running, f"every run finished before its kill: nothing was tested {again}"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + again
    final = finished_files(out)
    for snapshot in snapshots:
        # a kill mid-commit leaves a shard's temporaries (done/N.json.tmp included): that shard is not finished
        committed = {Path(name).stem for name in snapshot
                     if name.startswith("_clip_flash/done/") and name.endswith(".json")}
        for name, identity in snapshot.items():
            if not name.endswith(".tmp") and Path(name).stem.rsplit("_", 1)[-1] in committed:
                assert final[name] == identity, f"{name} changed after its shard was finished {again}"
    try:
        assert_exactly_once(out, inputs)
    except AssertionError as error:
        raise AssertionError(f"{error} {again}") from error


def test_other_settings_are_refused_before_touching_the_folder(tmp_path, checkpoint):
    write_photos(tmp_path / "photos", count=2)
    out = tmp_path / "out"
    clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", progress=False)
    before = finished_files(out)
    for change in ({"model": MODEL}, {"normalize": False}, {"out_dtype": "float32"}, {"patch": False},
                   {"shard_size": 1}, {"captions": False}):
        options = {"model": f"{MODEL}::{checkpoint}", **change}
        with pytest.raises(SettingsMismatchError, match="refusing to mix") as raised:
            clip_flash.embed(tmp_path / "photos", out, device="cpu", progress=False, **options)
        assert "folder has" in str(raised.value)
    assert finished_files(out) == before


def test_changed_inputs_are_refused(tmp_path, checkpoint):
    paths = write_photos(tmp_path / "photos", count=4)
    out = tmp_path / "out"
    clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2, progress=False)
    moved = paths[0].with_name("z_renamed" + paths[0].suffix)
    paths[0].rename(moved)  # same count, other files in shard 0
    with pytest.raises(InputChangedError, match="the input changed since shard 0") as raised:
        clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                         progress=False)
    assert f"removed or renamed: {paths[0]}" in str(raised.value)
    moved.rename(paths[0])
    write_photos(tmp_path / "photos" / "more", count=1)  # a third shard: the plan itself changed
    with pytest.raises(InputChangedError, match="the input changed") as raised:
        clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                         progress=False)
    assert "shards: folder has 2, this job 3" in str(raised.value) and "other settings" not in str(raised.value)


def test_disk_full_stops_with_a_clear_error_and_loses_no_finished_shard(tmp_path, checkpoint, monkeypatch):
    inputs = write_photos(tmp_path / "photos", count=6)
    out = tmp_path / "out"
    real = writer_module._write_bytes_durably
    writes = []

    def fill_up(path, payload):
        if "img_emb_2" in path.name:  # shard 2's first file
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        writes.append(path)
        real(path, payload)

    monkeypatch.setattr(writer_module, "_write_bytes_durably", fill_up)
    with pytest.raises(OutputError, match=r"disk full.*Shards already finished are intact") as raised:
        clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                         batch_size=2, progress=False)
    assert "shard 2" in str(raised.value)
    assert done_shards(out) == {"0", "1"}
    assert not list(out.rglob("*_2.*")) and not list(out.rglob("*.tmp"))
    before = finished_files(out)
    monkeypatch.setattr(writer_module, "_write_bytes_durably", real)
    clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2, batch_size=2,
                     progress=False)
    assert {name: identity for name, identity in finished_files(out).items() if name in before} == before
    assert_exactly_once(out, inputs)


def test_a_second_job_on_the_same_folder_is_refused_while_the_first_runs(tmp_path, checkpoint):
    from clip_flash.jobs.writer import OutputFolder

    write_photos(tmp_path / "photos", count=2)
    model = f"{MODEL}::{checkpoint}"
    clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", progress=False)
    settings = json.loads((tmp_path / "out" / "_clip_flash" / "settings.json").read_text())
    running = OutputFolder(tmp_path / "out", shard_count=1)
    running.open(settings)  # what a job in another process holds while it runs
    try:
        with pytest.raises(OutputError, match=f"another job is writing to .*pid {os.getpid()}"):
            clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", progress=False)
    finally:
        running.close()
    assert clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu",
                            progress=False).shards_skipped == 1


def test_unusable_output_folder_is_a_clear_error(tmp_path):
    write_photos(tmp_path / "photos", count=1)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(OutputError, match="cannot use output folder"):
        clip_flash.embed(tmp_path / "photos", tmp_path / "a_file" / "out", MODEL, device="cpu", progress=False)


def test_cli_exit_status_and_message_for_a_refused_folder(tmp_path, checkpoint):
    write_photos(tmp_path / "photos", count=1)
    from importlib import util

    spec = util.spec_from_file_location("embed_script", REPO / "scripts" / "embed.py")
    script = util.module_from_spec(spec)
    spec.loader.exec_module(script)
    arguments = ["--model", f"{MODEL}::{checkpoint}", "--device", "cpu", "--input", str(tmp_path / "photos"),
                 "--out", str(tmp_path / "out"), "--no-progress"]
    assert script.main(arguments) == 0
    assert script.main(arguments[:1] + [MODEL] + arguments[2:]) == 2
