"""The run's first batches decoded while the model loads: the expected inputs are the loaded model's, the run takes
the batches decoded during the load and its rows are those of a run that did not, a model whose inputs differ
from the expected ones gets its own, and a failed load leaves no feed running."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import clip_flash
from clip_flash.jobs import beside_load_work, feed_ahead as feed_ahead_module, job as job_module
from clip_flash.jobs.feed_ahead import same_inputs
from clip_flash.models import ExpectedInputs, ModelLoadError, inputs_before_load, parse_model_spec
from .job_helpers import MODEL, read_output, write_photos


def _embed(photos: Path, out: Path, **options):
    return clip_flash.embed(photos, out, model=MODEL, device="cpu", batch_size=2, progress=False, **options)


def _embed_without_feed_ahead(photos: Path, out: Path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(job_module, "feed_ahead", lambda *args, **kwargs: None)
        return _embed(photos, out)


def _decoded_beside_load(summary) -> bool:
    record = json.loads(Path(summary.record_path).read_text())
    return record["options"]["first_batches_decoded_beside_the_load"]


def _decodes_seen(monkeypatch) -> list:
    """Patch the feed's decoding to note when each batch was decoded; the list of times."""
    seen: list = []
    real = feed_ahead_module.decode_batch

    def noting(*args):
        result = real(*args)
        seen.append(time.perf_counter())
        return result

    monkeypatch.setattr(feed_ahead_module, "decode_batch", noting)
    return seen


def test_the_expected_inputs_are_the_loaded_models(stock_model):
    model, preprocess = stock_model
    expected = inputs_before_load(parse_model_spec(MODEL))
    assert same_inputs(expected, SimpleNamespace(preprocess=preprocess, context_length=model.context_length))
    # a pretrained tag's own normalisation, from its configuration (nothing downloaded)
    tagged = inputs_before_load(parse_model_spec("ViT-L-14::laion2b_s32b_b82k"))
    assert tagged.preprocess.transforms[-1].mean == (0.5, 0.5, 0.5) and tagged.context_length == 77
    assert not same_inputs(tagged, SimpleNamespace(preprocess=preprocess, context_length=model.context_length))
    assert inputs_before_load(parse_model_spec("hf-hub:someone/some-clip")) is None


def test_the_run_takes_batches_decoded_during_the_load_and_its_rows_are_unchanged(tmp_path, monkeypatch):
    write_photos(tmp_path / "photos", count=8, captions=True)
    reference = _embed_without_feed_ahead(tmp_path / "photos", tmp_path / "reference", monkeypatch)

    seen = _decodes_seen(monkeypatch)
    real_load = job_module.load_job_model
    load_ended = []

    def load_after_a_decode(*args):
        loaded = real_load(*args)
        deadline = time.monotonic() + 120
        while not seen:  # the feed decodes while the model loads: the load ends only after it did
            assert time.monotonic() < deadline, "nothing was decoded while the model loaded"
            time.sleep(0.01)
        load_ended.append(time.perf_counter())
        return loaded

    monkeypatch.setattr(job_module, "load_job_model", load_after_a_decode)
    summary = _embed(tmp_path / "photos", tmp_path / "ahead")
    assert _decoded_beside_load(summary) and seen[0] < load_ended[0]
    ours, theirs = read_output(tmp_path / "ahead"), read_output(tmp_path / "reference")
    assert summary.rows == reference.rows == 8
    assert np.array_equal(ours["img_emb"], theirs["img_emb"]) and np.array_equal(ours["text_emb"], theirs["text_emb"])
    assert ours["metadata"] == theirs["metadata"]


def test_a_model_whose_inputs_were_not_expected_gets_its_own(tmp_path, monkeypatch):
    import open_clip

    write_photos(tmp_path / "photos", count=6, captions=True)
    reference = read_output(Path(_embed_without_feed_ahead(tmp_path / "photos", tmp_path / "reference",
                                                           monkeypatch).out))
    wrong = ExpectedInputs(open_clip.image_transform(256, is_train=False), 77)  # another input size
    monkeypatch.setattr("clip_flash.models.inputs_before_load", lambda spec: wrong)
    summary = _embed(tmp_path / "photos", tmp_path / "dropped")
    assert not _decoded_beside_load(summary)
    ours = read_output(tmp_path / "dropped")
    assert np.array_equal(ours["img_emb"], reference["img_emb"]) and ours["metadata"] == reference["metadata"]


def _feed_threads() -> list:
    return [thread for thread in threading.enumerate()
            if thread.name.startswith(("clip_flash-reader", "clip_flash-feed-ahead")) and thread.is_alive()]


def test_a_failed_load_stops_the_feed(tmp_path, monkeypatch):
    write_photos(tmp_path / "photos", count=8, captions=False)
    seen = _decodes_seen(monkeypatch)

    def failing_load(*args):
        deadline = time.monotonic() + 120
        while not seen:
            assert time.monotonic() < deadline, "nothing was decoded while the model loaded"
            time.sleep(0.01)
        raise ModelLoadError("error: cannot build the model (a test's failure)")

    monkeypatch.setattr(job_module, "load_job_model", failing_load)
    with pytest.raises(ModelLoadError):
        _embed(tmp_path / "photos", tmp_path / "out")
    deadline = time.monotonic() + 10
    while _feed_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _feed_threads()


def test_the_feed_draws_nothing_from_torchs_random_numbers(tmp_path):
    """It runs while a random-init model draws its weights from torch's generator: a draw would change them."""
    import torch

    from clip_flash.jobs.batch_feed import DONE, Batch

    write_photos(tmp_path / "photos", count=6, captions=True)
    job = job_module.plan_job(tmp_path / "photos", tmp_path / "out", MODEL, device_type="cpu", precision=None,
                              patch=True, pipeline="clip_flash", decode="cpu", shard_size=4, normalize=True,
                              out_dtype="float16", captions=None, caption_column=None, repeat=1)
    ahead = None
    try:
        before = torch.get_rng_state()
        ahead = beside_load_work.feed_ahead(job, torch.device("cpu"), "clip_flash", "cpu", 2, None, "auto", None, 0.0,
                                            None, after=())
        ahead.join()
        decoded = 0
        while True:
            entry = ahead.feed.get()
            if entry is DONE:
                break
            if isinstance(entry, Batch):
                images, tokens = entry.decoded.result()
                decoded += len(entry.items)
        assert decoded == 6 and tokens is not None
        assert torch.equal(before, torch.get_rng_state())
    finally:
        if ahead is not None:
            ahead.close()
        job.output.close()
