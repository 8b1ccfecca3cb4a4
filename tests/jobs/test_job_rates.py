"""What a job reports about its speed: the setup before its run (model load, the decoder's start), the first
batch's time, the run's rate, the rate after the first shard, the rate from the model loaded and the rate counting
the whole setup, in the summary and in the run record; and the decoding workers it ran with."""
from __future__ import annotations

import json

import pytest

import clip_flash
import clip_flash.inputs.image.native_decode
from .job_helpers import MODEL, read_output, write_photos


@pytest.mark.parametrize("executor", ["auto", "thread"])
def test_summary_and_record_give_setup_first_batch_and_every_rate(tmp_path, checkpoint, executor):
    write_photos(tmp_path / "photos", count=9, captions=False)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               shard_size=4, batch_size=2, executor=executor, progress=False)
    assert (summary.rows, summary.failures, summary.shards_written) == (9, 1, 3)
    assert summary.setup_seconds > 0 and 0 < summary.first_batch_seconds <= summary.seconds
    assert 0 < summary.warm_up_seconds < summary.setup_seconds  # the decoder's start, within the setup
    assert summary.steady_items_per_s > 0  # three shards: the rate after the first one
    assert summary.job_items_per_s == pytest.approx(10 / (summary.setup_seconds + summary.seconds))
    assert 0 < summary.model_load_seconds < summary.setup_seconds
    assert summary.after_load_seconds == pytest.approx(summary.setup_seconds - summary.model_load_seconds
                                                       + summary.seconds)
    assert summary.job_items_per_s < summary.after_load_items_per_s < summary.items_per_s
    text = summary.format()
    assert "after the first shard" in text and "setup:" in text and "from the model loaded" in text
    assert "counting all of it" in text
    record = json.loads(open(summary.record_path).read())
    for key in ("items_per_s", "steady_items_per_s", "job_items_per_s", "setup_seconds", "warm_up_seconds",
                "first_batch_seconds", "model_load_seconds", "after_load_items_per_s"):
        assert record["summary"][key] == pytest.approx(getattr(summary, key))
    options = record["options"]
    assert options["executor"] == executor
    assert options["decode_executor"] == executor
    assert options["decode_workers"] >= 1
    assert options["decode_native"] is (executor == "auto" and clip_flash.inputs.image.native_decode.NativeBatchDecoder
                                        .create(1) is not None)
    assert options["image_cuda_graphs"] is False  # graphs are a CUDA device's
    assert options["decode_threads"] == 2  # the default
    assert len(read_output(tmp_path / "out")["metadata"]["image_path"]) == 9


def test_unknown_executor_is_refused(tmp_path):
    write_photos(tmp_path / "photos", count=1)
    with pytest.raises(ValueError, match="executor"):
        clip_flash.embed(tmp_path / "photos", tmp_path / "out", MODEL, device="cpu", executor="fibers",
                         progress=False)


def test_decode_threads_setting_is_used_and_recorded(tmp_path, checkpoint):
    write_photos(tmp_path / "photos", count=6, captions=False)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               shard_size=4, batch_size=2, executor="thread", decode_threads=3, progress=False)
    assert summary.rows == 6
    assert json.loads(open(summary.record_path).read())["options"]["decode_threads"] == 3
    with pytest.raises(ValueError, match="decode_threads"):
        clip_flash.embed(tmp_path / "photos", tmp_path / "out2", f"{MODEL}::{checkpoint}", device="cpu",
                         decode_threads=0, progress=False)
