"""One pipeline run fed with shards while it runs (a Ray actor's): each shard is committed without waiting for
the next, the rows are the one-device job's, and a failed shard fails its own caller while the next run goes on."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import clip_flash
from clip_flash.jobs.job import load_job_model, plan_job
from clip_flash.jobs.runner import make_runner
from clip_flash.jobs.launch_thread import LaunchThread
from clip_flash.jobs.shard_stream import ShardStream
from .job_helpers import MODEL, read_output, write_photos

OPTIONS = dict(normalize=False, out_dtype="float32")


def _planned(tmp_path, checkpoint, out_name):
    write_photos(tmp_path / "photos", count=5)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"not a jpeg")
    job = plan_job(tmp_path / "photos", tmp_path / out_name, f"{MODEL}::{checkpoint}", device_type="cpu",
                   precision=None, patch=True, pipeline="clip_flash", decode="cpu", shard_size=2, captions=None,
                   caption_column=None, repeat=1, **OPTIONS)
    loaded = load_job_model(job, torch.device("cpu"))
    runner = make_runner(loaded, job.source, torch.device("cpu"), "clip_flash", "cpu", 2, OPTIONS["normalize"],
                         OPTIONS["out_dtype"], 1, "thread")
    return job, runner


def test_a_shard_is_committed_before_the_next_is_handed_in(tmp_path, checkpoint):
    """A None in the shard stream finishes the batches in flight: the first shard's commit comes while the
    stream still holds back the second (without it the run would wait for the second shard's batches)."""
    job, runner = _planned(tmp_path, checkpoint, "out")
    runner.batches_in_flight = 2  # as on CUDA, where launched batches are collected only after later launches
    committed = []
    first_committed = threading.Event()

    def commit(result):
        committed.append(result.index)
        first_committed.set()

    def stream():
        yield job.todo[0]
        yield None
        if not first_committed.wait(timeout=120):
            raise AssertionError("the first shard was not committed while the stream had nothing more")
        yield job.todo[1]

    stats = runner.run(stream(), commit, None, more_runs_follow=True)
    assert committed == [job.todo[0].index, job.todo[1].index] and stats.shards == 2
    job.output.close()


def test_shards_from_two_callers_give_the_one_device_jobs_rows(tmp_path, checkpoint):
    job, runner = _planned(tmp_path, checkpoint, "streamed")
    job.output.record_settings(job.settings)
    stream = ShardStream(runner, job.output.write)
    with ThreadPoolExecutor(2) as callers:
        reports = list(callers.map(stream.embed, job.todo))
    stream.close()
    job.output.close()
    assert [(report.index, report.rows, report.failures) for report in reports] == [(0, 1, 1), (1, 2, 0), (2, 2, 0)]
    assert all(report.seconds > 0 for report in reports)
    clip_flash.embed(tmp_path / "photos", tmp_path / "one", f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                     batch_size=2, progress=False, **OPTIONS)
    streamed, one = read_output(tmp_path / "streamed"), read_output(tmp_path / "one")
    assert streamed["img_emb_files"] == one["img_emb_files"] and streamed["metadata"] == one["metadata"]
    np.testing.assert_allclose(streamed["img_emb"], one["img_emb"], atol=1e-5)
    np.testing.assert_allclose(streamed["text_emb"], one["text_emb"], atol=1e-5)


def test_a_failed_commit_fails_its_shard_and_the_next_shard_runs_anew(tmp_path, checkpoint):
    job, runner = _planned(tmp_path, checkpoint, "out")
    written = []

    def commit(result):
        if result.index == 1:
            raise OSError("disk full")
        written.append(result.index)

    launch = LaunchThread()
    launched_on = []
    run = runner.run

    def recording_run(*args, **kwargs):
        launched_on.append(threading.get_ident())
        return run(*args, **kwargs)

    runner.run = recording_run
    stream = ShardStream(runner, commit, launch)
    first = stream.embed(job.todo[0])
    assert (first.rows, first.failures) == (1, 1)
    with pytest.raises(OSError, match="disk full"):
        stream.embed(job.todo[1])
    assert stream.embed(job.todo[2]).rows == 2  # a new run: the failed one's thread ended first
    stream.close()
    job.output.close()
    assert written == [0, 2]
    # both runs made their device calls on the launch thread handed in (the one that made the first uses)
    assert launched_on == [launch.submit(threading.get_ident).result()] * 2
