"""The Ray path on a local CPU Ray: the same shards as the one-device job, resumable; ClipEmbedder."""
from __future__ import annotations

import io
import json
from importlib import util
from pathlib import Path

import numpy as np
import pytest
import torch

import clip_flash
from .job_helpers import MODEL, read_output, write_photos

REPO = Path(__file__).resolve().parents[2]
ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install clip_flash[ray]")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_job_writes_what_the_one_device_job_writes_and_resumes(tmp_path, checkpoint, local_ray):
    from clip_flash.jobs.ray_data import embed_with_ray

    photos = write_photos(tmp_path / "photos", count=5)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"not a jpeg")
    options = dict(device="cpu", shard_size=2, batch_size=2, normalize=False, out_dtype="float32", progress=False)
    model = f"{MODEL}::{checkpoint}"
    summary = embed_with_ray(tmp_path / "photos", tmp_path / "ray_out", model, actors=1, **options)
    assert (summary.shards_written, summary.rows, summary.failures) == (3, 5, 1)
    # the run counts from the actor's model loaded, as the one-device job's does from its own
    (actor,) = summary.actor_timeline
    assert actor["shards"] == 3 and 0 < actor["started"] <= actor["libraries"] <= actor["loaded"] <= actor["ready"]
    assert actor["ready"] <= actor["first_shard"] < actor["last_shard_done"]
    assert actor["spawned"] <= actor["imported"]  # a worker process Ray started ahead of the call: before it
    assert summary.model_load_seconds == summary.setup_seconds == actor["loaded"]
    assert summary.after_load_seconds == pytest.approx(summary.seconds)
    assert summary.job_items_per_s < summary.items_per_s
    assert "model loaded" in summary.format() and actor["actor"] in summary.format()
    clip_flash.embed(tmp_path / "photos", tmp_path / "one_out", model, **options)
    ray_output, one_output = read_output(tmp_path / "ray_out"), read_output(tmp_path / "one_out")
    assert ray_output["img_emb_files"] == one_output["img_emb_files"] == ["img_emb_0.npy", "img_emb_1.npy",
                                                                           "img_emb_2.npy"]
    assert ray_output["metadata"] == one_output["metadata"]
    assert len(ray_output["metadata"]["image_path"]) == len(photos)
    np.testing.assert_allclose(ray_output["img_emb"], one_output["img_emb"], atol=1e-5)
    np.testing.assert_allclose(ray_output["text_emb"], one_output["text_emb"], atol=1e-5)
    assert [row["path"] for row in ray_output["failures"]] == [str(tmp_path / "photos" / "broken.jpg")]

    # resume through the command line's --ray: a shard lost (its marker gone) is embedded again, the rest kept
    (tmp_path / "ray_out" / "_clip_flash" / "done" / "1.json").unlink()
    spec = util.spec_from_file_location("embed_script", REPO / "scripts" / "embed.py")
    script = util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--model", model, "--input", str(tmp_path / "photos"), "--out", str(tmp_path / "ray_out"),
                        "--device", "cpu", "--shard-size", "2", "--batch-size", "2", "--no-normalize",
                        "--out-dtype", "float32", "--no-progress", "--ray", "--ray-workers", "1"]) == 0
    runs = (tmp_path / "ray_out" / "_clip_flash" / "runs").glob("run_*.json")
    records = sorted(runs, key=lambda path: path.stat().st_mtime)
    again = json.loads(records[-1].read_text())["summary"]
    assert (again["shards_skipped"], again["shards_written"]) == (2, 1)
    assert read_output(tmp_path / "ray_out")["metadata"] == one_output["metadata"]
    # and the one-device job accepts the Ray job's folder as its own (same settings)
    assert clip_flash.embed(tmp_path / "photos", tmp_path / "ray_out", model, **options).shards_skipped == 3


@pytest.mark.slow
def test_clip_embedder_in_map_batches(tmp_path, checkpoint, stock_model, local_ray):
    import open_clip
    from PIL import Image

    from clip_flash.jobs.ray_data import ClipEmbedder

    photos = write_photos(tmp_path / "photos", count=3)
    rows = [{"id": index, "bytes": path.read_bytes(), "caption": path.with_suffix(".txt").read_text()}
            for index, path in enumerate(photos)]
    rows.append({"id": 3, "bytes": b"corrupt", "caption": "a broken file"})
    dataset = ray.data.from_items(rows).map_batches(
        ClipEmbedder, batch_size=4, compute=ray.data.ActorPoolStrategy(size=1),
        fn_constructor_kwargs={"model": f"{MODEL}::{checkpoint}", "image_column": "bytes", "text_column": "caption",
                               "device": "cpu", "patch": False, "normalize": False, "out_dtype": "float32"})
    result = sorted(dataset.take_all(), key=lambda row: row["id"])
    model, preprocess = stock_model
    tokenizer = open_clip.get_tokenizer(MODEL)
    with torch.no_grad():
        images = model.encode_image(torch.stack([preprocess(Image.open(io.BytesIO(row["bytes"]))) for row in rows[:3]]))
        texts = model.encode_text(tokenizer([row["caption"] for row in rows]))
    np.testing.assert_allclose(np.stack([row["img_emb"] for row in result[:3]]), images.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.stack([row["text_emb"] for row in result]), texts.numpy(), atol=1e-5)
    assert [row["error"] for row in result[:3]] == ["", "", ""] and result[3]["error"]
    assert np.isnan(result[3]["img_emb"]).all()
