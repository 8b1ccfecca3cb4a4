"""The Ray path on one GPU (skipped without CUDA or Ray): a local Ray with the GPU, one model actor on it,
writes the rows, metadata and failures the one-device job writes on the same GPU."""
from __future__ import annotations

import json

import numpy as np
import pytest

import clip_flash
from .job_helpers import read_output, write_photos

pytestmark = pytest.mark.gpu
ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install clip_flash[ray]")

GPU_MODEL = "ViT-B-32"


@pytest.fixture(scope="module")
def local_ray_with_the_gpu():
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_job_on_the_gpu_writes_what_the_one_device_job_writes(tmp_path, local_ray_with_the_gpu):
    from clip_flash.jobs.ray_data import embed_with_ray

    write_photos(tmp_path / "photos", count=45)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"not a jpeg")
    # The --ray defaults: decoding threads in the actor. Shards of 20 in batches of 8: full batches replay the
    # image graph, the rest run eager, in both jobs.
    options = dict(shard_size=20, batch_size=8, normalize=False, out_dtype="float32", executor="thread",
                   progress=False)
    summary = embed_with_ray(tmp_path / "photos", tmp_path / "ray_out", GPU_MODEL, actors=1, **options)
    assert (summary.shards_written, summary.rows, summary.failures) == (3, 45, 1)
    assert summary.device == "ray: 1 actor(s) on cuda" and summary.gpu_peak_mib > 0  # the actor ran on the GPU
    record = json.loads(open(summary.record_path).read())
    assert record["options"]["cluster"] == {"CPU": 4.0, "GPU": 1.0}
    one = clip_flash.embed(tmp_path / "photos", tmp_path / "one_out", GPU_MODEL, device="cuda", **options)
    assert one.rows == 45
    ray_output, one_output = read_output(tmp_path / "ray_out"), read_output(tmp_path / "one_out")
    assert ray_output["img_emb_files"] == one_output["img_emb_files"]
    assert ray_output["metadata"] == one_output["metadata"]
    np.testing.assert_array_equal(ray_output["img_emb"], one_output["img_emb"])
    np.testing.assert_array_equal(ray_output["text_emb"], one_output["text_emb"])
    assert [row["path"] for row in ray_output["failures"]] == [str(tmp_path / "photos" / "broken.jpg")]
