"""The job's output: the same numbers as stock OpenCLIP row by row, in clip-retrieval's exact layout."""
from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import clip_flash
from .job_helpers import MODEL, read_output, write_photos


def test_rows_equal_stock_encode_image_and_text(tmp_path, checkpoint, stock_model):
    """fp32 CPU, stock model, raw embeddings, batch 1: each row is bit-identical to
    ``model.encode_image(preprocess(Image.open(p)))`` and ``model.encode_text(tokenizer([caption]))``."""
    import open_clip

    paths = write_photos(tmp_path / "photos", count=5)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               patch=False, normalize=False, out_dtype="float32", batch_size=1, shard_size=2,
                               progress=False)
    assert (summary.rows, summary.failures, summary.shards_written) == (5, 0, 3)
    output = read_output(tmp_path / "out")
    ordered = sorted(paths, key=lambda path: path.relative_to(tmp_path / "photos").as_posix())
    assert output["metadata"]["image_path"] == [str(path) for path in ordered]

    model, preprocess = stock_model
    tokenizer = open_clip.get_tokenizer(MODEL)
    assert output["img_emb"].dtype == np.float32 and output["img_emb"].shape == (5, model.visual.output_dim)
    with torch.no_grad():
        for row, path in enumerate(ordered):
            expected_image = model.encode_image(preprocess(Image.open(path)).unsqueeze(0))[0].numpy()
            np.testing.assert_array_equal(output["img_emb"][row], expected_image, err_msg=str(path))
            caption = path.with_suffix(".txt").read_text()
            assert output["metadata"]["caption"][row] == caption
            expected_text = model.encode_text(tokenizer([caption]))[0].numpy()
            np.testing.assert_array_equal(output["text_emb"][row], expected_text, err_msg=caption)


def test_default_job_is_patched_normalized_float16_and_close_to_stock(tmp_path, checkpoint, stock_model):
    paths = write_photos(tmp_path / "photos", count=4, captions=False)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               progress=False)
    assert summary.patched and summary.rows == 4
    output = read_output(tmp_path / "out")
    assert output["text_emb"] is None and "caption" not in output["metadata"]
    assert not (tmp_path / "out" / "text_emb").exists()  # as clip-retrieval: no empty embedding folder
    embeddings = output["img_emb"]
    assert embeddings.dtype == np.float16
    np.testing.assert_allclose(np.linalg.norm(embeddings.astype(np.float32), axis=1), 1.0, atol=2e-3)
    model, preprocess = stock_model
    ordered = sorted(paths, key=lambda path: path.relative_to(tmp_path / "photos").as_posix())
    with torch.no_grad():
        expected = model.encode_image(torch.stack([preprocess(Image.open(path)) for path in ordered]))
    expected = torch.nn.functional.normalize(expected, dim=-1).numpy()
    np.testing.assert_allclose(embeddings.astype(np.float32), expected, atol=2e-3)


def test_layout_matches_clip_retrieval_and_embedding_reader(tmp_path, checkpoint):
    """File names zero-padded the way clip-retrieval pads them, headers embedding-reader can parse, the
    three folders paired shard by shard when sorted, and the job settings/run record written."""
    write_photos(tmp_path / "photos", count=11)
    clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                     shard_size=1, batch_size=4, progress=False)
    output = read_output(tmp_path / "out")
    numbers = [f"{index:02d}" for index in range(11)]  # 11 shards: int(log10(11)) + 1 = 2 digits
    assert output["img_emb_files"] == [f"img_emb_{number}.npy" for number in numbers]
    assert output["text_emb_files"] == [f"text_emb_{number}.npy" for number in numbers]
    assert output["metadata_files"] == [f"metadata_{number}.parquet" for number in numbers]
    for number in numbers:
        with open(tmp_path / "out" / "img_emb" / f"img_emb_{number}.npy", "rb") as handle:
            first_line = str(handle.read(300).split(b"\n")[0])
        # the two regular expressions embedding-reader reads a .npy header with
        assert re.search(r"'shape': \(([0-9]+), ([0-9]+)\)", first_line).groups() == ("1", "384")
        assert re.search(r"'descr': '([<f0-9]+)'", first_line).group(1) == "<f2"
        table = pq.read_table(tmp_path / "out" / "metadata" / f"metadata_{number}.parquet")
        assert table.column_names == ["image_path", "caption"] and table.num_rows == 1
        assert str(table.schema.field("image_path").type) == "string"
    settings = json.loads((tmp_path / "out" / "_clip_flash" / "settings.json").read_text())
    assert settings["model"] == MODEL and settings["precision"] == "fp32" and settings["shards"] == 11
    records = list((tmp_path / "out" / "_clip_flash" / "runs").glob("run_*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["environment"]["git_revision"] and record["environment"]["clip_flash_environment"]["torch"]
    assert record["summary"]["rows"] == 11 and record["settings"] == settings


def test_summary_reports_items_failures_and_rate(tmp_path, checkpoint):
    write_photos(tmp_path / "photos", count=3, captions=False)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               progress=False)
    text = summary.format()
    assert "items: 4 (3 embedded, 1 failed" in text and "items/s" in text
    assert f"fed by {summary.cpu_cores} CPU cores" in text
    assert summary.items_per_s > 0


@pytest.mark.parametrize("bad", ["pipeline", "decode", "out_dtype"])
def test_bad_options_are_refused(tmp_path, bad):
    write_photos(tmp_path / "photos", count=1)
    with pytest.raises(ValueError, match=bad):
        clip_flash.embed(tmp_path / "photos", tmp_path / "out", MODEL, device="cpu", progress=False,
                         **{bad: "nonsense"})
