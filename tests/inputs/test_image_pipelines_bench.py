"""bench_clip's end-to-end image pipelines on the CPU: a bad file is reported and skipped, never fatal."""
from __future__ import annotations

import pytest
import torch

from benchmarks.harness.image_pipelines import format_image_pipelines, measure_image_pipelines
from photo_corpus import skimage_photo


@pytest.mark.slow
def test_pipelines_skip_and_report_a_bad_file(build_model, vit_b32_preprocess, tmp_path):
    for number, name in enumerate(("astronaut.png", "coffee.png", "chelsea.png")):
        skimage_photo(name).convert("RGB").resize((160, 120)).save(tmp_path / f"photo{number}.jpg", quality=90)
    (tmp_path / "broken.jpg").write_bytes(b"not a photo")
    paths = sorted(tmp_path.iterdir())
    data = measure_image_pipelines(build_model("ViT-B-32"), vit_b32_preprocess, paths, ("stock", "exact"),
                                   torch.device("cpu"), torch.float32, (224, 224), batch=4, batches=1, workers=1,
                                   warmup=1, encoder_repeats=1)
    for row in data["pipelines"]:
        assert row["images_embedded"] == 3, row  # 4 files per batch, one of them unreadable
        assert row["images_per_s"] > 0
        assert len(row["skipped_files"]) == 1 and "broken.jpg" in row["skipped_files"][0]
    assert data["pipelines"][1]["routes"] == {"jpeg": 3, "failed": 1}
    assert data["pipelines"][0]["decode_wait_ms_median"] is None  # the DataLoader's waits are not split out
    assert data["pipelines"][1]["decode_wait_ms_median"] >= 0.0
    # Exact pixels, same model, same batch: the very same embeddings as OpenCLIP's preprocess gives.
    assert data["pipelines"][1]["first_batch_vs_stock"]["max_abs_diff"] == 0.0
    text = format_image_pipelines(data)
    assert "stock:" in text and "exact:" in text and "Skipped 1 unreadable file" in text
