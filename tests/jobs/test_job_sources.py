"""What a job reads: folders with bad files, WebDataset tars, caption files (text-only jobs)."""
from __future__ import annotations

import io
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import torch

import clip_flash
from clip_flash.jobs.sources import (
    CaptionFileSource,
    FolderSource,
    SourceError,
    WebDatasetSource,
    expand_braces,
    load_caption_items,
    open_source,
)
from .job_helpers import MODEL, read_output, write_photos


def test_folder_with_corrupt_files_embeds_the_rest_and_lists_each_failure(tmp_path, checkpoint):
    good = write_photos(tmp_path / "photos", count=4, captions=False)
    jpeg = good[0].read_bytes()
    bad = {
        "empty.jpg": b"",
        "text_named.jpg": b"this is not an image\n",
        "truncated.jpg": jpeg[: len(jpeg) // 3],
        "garbage.png": bytes(range(256)) * 4,
    }
    for name, payload in bad.items():
        (tmp_path / "photos" / name).write_bytes(payload)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               shard_size=3, batch_size=2, progress=False)
    output = read_output(tmp_path / "out")
    embedded = output["metadata"]["image_path"]
    failed = {row["path"]: row["reason"] for row in output["failures"]}
    # Pillow opens a truncated JPEG lazily and fails at load time, or (depending on where it was cut)
    # decodes a partial image: either way it is accounted for exactly once.
    assert {str(tmp_path / "photos" / name) for name in ("empty.jpg", "text_named.jpg", "garbage.png")} <= set(failed)
    assert set(embedded) | set(failed) == {str(path) for path in good} | {str(tmp_path / "photos" / n) for n in bad}
    assert not set(embedded) & set(failed)
    assert all(str(path) in embedded for path in good)
    assert all(reason for reason in failed.values())
    assert summary.failures == len(failed) == summary.failures_total
    assert output["img_emb"].shape[0] == len(embedded)


def test_captions_are_read_where_they_exist_and_required_only_when_asked(tmp_path, checkpoint):
    """Images without a .txt get an empty caption (not a failure); a broken image fails with its own reason;
    ``require_captions`` keeps pairs only."""
    paths = write_photos(tmp_path / "photos", count=4)
    paths[1].with_suffix(".txt").unlink()
    broken = tmp_path / "photos" / "broken.jpg"  # no caption either: its failure is about the image
    broken.write_bytes(b"not a jpeg")
    model = f"{MODEL}::{checkpoint}"
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", progress=False)
    output = read_output(tmp_path / "out")
    captions = dict(zip(output["metadata"]["image_path"], output["metadata"]["caption"]))
    assert set(captions) == {str(path) for path in paths}
    assert captions[str(paths[1])] == "" and captions[str(paths[0])] == paths[0].with_suffix(".txt").read_text()
    assert [row["path"] for row in output["failures"]] == [str(broken)]
    assert "caption" not in output["failures"][0]["reason"]
    assert (summary.rows, summary.failures) == (4, 1)
    assert output["img_emb"].shape[0] == output["text_emb"].shape[0] == 4

    clip_flash.embed(tmp_path / "photos", tmp_path / "pairs", model, device="cpu", require_captions=True,
                     progress=False)
    output = read_output(tmp_path / "pairs")
    assert str(paths[1]) not in output["metadata"]["image_path"]
    reasons = {row["path"]: row["reason"] for row in output["failures"]}
    assert "no caption file photo_01.txt beside the image" in reasons[str(paths[1])]
    # --no-captions: every readable image, no text
    clip_flash.embed(tmp_path / "photos", tmp_path / "out2", model, device="cpu", captions=False, progress=False)
    assert read_output(tmp_path / "out2")["img_emb"].shape[0] == 4
    assert not (tmp_path / "out2" / "text_emb").exists()


def _write_tar(path, samples):
    with tarfile.open(path, "w") as archive:
        for name, payload in samples:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))


def test_webdataset_shards_one_output_shard_per_tar_with_keys(tmp_path, checkpoint, stock_model):
    from PIL import Image

    photos = write_photos(tmp_path / "photos", count=5, captions=False)
    jpegs = [path.read_bytes() for path in photos]
    tars = tmp_path / "tars"
    tars.mkdir()
    _write_tar(tars / "00000.tar", [("s/000.jpg", jpegs[0]), ("s/000.txt", b"first"),
                                     ("s/001.jpg", jpegs[1]), ("s/001.json", b'{"caption": "second"}'),
                                     ("s/002.txt", b"no image here")])
    _write_tar(tars / "00001.tar", [("s/003.png", jpegs[2]), ("s/003.txt", b"third"),
                                     ("s/004.jpg", b"corrupt"), ("s/004.txt", b"bad")])
    summary = clip_flash.embed(str(tars / "{00000..00001}.tar"), tmp_path / "out", f"{MODEL}::{checkpoint}",
                               device="cpu", normalize=False, out_dtype="float32", progress=False)
    assert (summary.shards_planned, summary.rows, summary.failures) == (2, 3, 2)
    output = read_output(tmp_path / "out")
    assert output["img_emb_files"] == ["img_emb_0.npy", "img_emb_1.npy"]
    assert output["metadata"]["image_path"] == ["s/000", "s/001", "s/003"]  # clip-retrieval: the key
    assert output["metadata"]["key"] == ["s/000", "s/001", "s/003"]
    assert output["metadata"]["caption"] == ["first", "second", "third"]
    assert {row["path"]: row["shard"] for row in output["failures"]} == {"s/002": "0", "s/004": "1"}
    model, preprocess = stock_model
    with torch.no_grad():
        expected = model.encode_image(torch.stack([preprocess(Image.open(io.BytesIO(jpegs[i]))) for i in (0, 1, 2)]))
    np.testing.assert_allclose(output["img_emb"], expected.numpy(), atol=1e-5)


def test_webdataset_truncated_tar_keeps_what_was_read_and_reports_the_rest(tmp_path, checkpoint):
    photos = write_photos(tmp_path / "photos", count=2, captions=False)
    _write_tar(tmp_path / "a.tar", [("k0.jpg", photos[0].read_bytes()), ("k1.jpg", photos[1].read_bytes())])
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "a.tar").write_bytes(data[: 512 + len(photos[0].read_bytes()) + 700])  # cut inside k1
    clip_flash.embed(str(tmp_path / "a.tar"), tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                     progress=False)
    output = read_output(tmp_path / "out")
    assert output["metadata"]["image_path"] == ["k0"]
    assert len(output["failures"]) == 1 and "tar read error" in output["failures"][0]["reason"]


@pytest.mark.parametrize("kind", ["txt", "csv", "parquet"])
def test_text_only_job_from_caption_file(tmp_path, checkpoint, stock_model, kind):
    import open_clip

    captions = ["a dog", "two cats, sleeping", "a \u2028 separator\x0b\x0c\x1d\x85 inside", "a \"quoted\" caption",
                "the last one"]
    path = tmp_path / f"captions.{kind}"
    if kind == "txt":
        path.write_text("\n".join(captions) + "\n")
    elif kind == "csv":
        pa_csv.write_csv(pa.table({"id": list(range(5)), "text": captions}), path)
    else:
        pq.write_table(pa.table({"caption": captions, "other": [1.0] * 5}), path)
    summary = clip_flash.embed(path, tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu", patch=False,
                               normalize=False, out_dtype="float32", shard_size=2, progress=False)
    assert summary.rows == 5 and summary.decode == "n/a"
    output = read_output(tmp_path / "out")
    assert output["img_emb"] is None and not (tmp_path / "out" / "img_emb").exists()
    ids = [str(row) for row in range(5)] if kind == "csv" else [f"{path}:{row}" for row in range(1, 6)]
    assert output["metadata"] == {"caption": captions, "id": ids}
    model, _ = stock_model
    with torch.no_grad():
        expected = model.encode_text(open_clip.get_tokenizer(MODEL)(captions))
    np.testing.assert_allclose(output["text_emb"], expected.numpy(), atol=1e-5)


def test_caption_column_choice(tmp_path):
    path = tmp_path / "c.csv"
    pa_csv.write_csv(pa.table({"a": ["x"], "b": ["y"]}), path)
    with pytest.raises(SourceError, match="which column"):
        CaptionFileSource(path, 10)
    assert CaptionFileSource(path, 10, column="b").captions == ["y"]
    with pytest.raises(SourceError, match="no column 'c'"):
        CaptionFileSource(path, 10, column="c")


def test_source_detection_and_plans(tmp_path):
    write_photos(tmp_path / "photos", count=5)
    source = open_source(tmp_path / "photos", shard_size=2)
    assert isinstance(source, FolderSource) and source.has_captions
    assert [shard.size for shard in source.shards()] == [2, 2, 1]
    assert [shard.fingerprint for shard in source.shards()] == [shard.fingerprint for shard in
                                                                open_source(tmp_path / "photos", 2).shards()]
    _write_tar(tmp_path / "photos" / "x.tar", [])
    assert isinstance(open_source(tmp_path / "photos", 2), FolderSource)  # images win over a stray tar
    (tmp_path / "tars").mkdir()
    _write_tar(tmp_path / "tars" / "b.tar", [("k.jpg", b"")])
    _write_tar(tmp_path / "tars" / "a.tar", [("k.jpg", b"")])
    source = open_source(tmp_path / "tars", 2)
    assert isinstance(source, WebDatasetSource) and [t.rsplit("/", 1)[1] for t in source.tars] == ["a.tar", "b.tar"]
    with pytest.raises(SourceError, match="not found"):
        open_source(tmp_path / "missing", 2)
    with pytest.raises(SourceError, match="no images"):
        open_source(tmp_path / "tars_empty_dir" if (tmp_path / "tars_empty_dir").mkdir() is None else "", 2)
    with pytest.raises(SourceError, match="cannot tell"):
        (tmp_path / "weird.bin").write_bytes(b"x")
        open_source(tmp_path / "weird.bin", 2)


def test_expand_braces():
    assert expand_braces("d/{000..002}.tar") == ["d/000.tar", "d/001.tar", "d/002.tar"]
    assert expand_braces("{a,b}-{8..10}") == ["a-8", "a-9", "a-10", "b-8", "b-9", "b-10"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_caption_batches_match_the_items_grouped(tmp_path):
    """A caption shard's batches of columns hold what its items, grouped, hold: rows, names, failures."""
    from clip_flash.jobs.batches import batches_from_items, caption_batches

    rng = np.random.default_rng(0)
    captions = [None if rng.random() < 0.2 else f"caption {row}" for row in range(103)]
    source_location = str(tmp_path / "c.parquet")
    for batch_size in (1, 7, 50, 200):
        fast = list(caption_batches(source_location, 1000, captions, batch_size))
        grouped = list(batches_from_items(load_caption_items(source_location, 1000, captions), batch_size))

        def flat(batches):
            rows = [(path, text) for batch, _ in batches if batch is not None
                    for path, text in zip(batch.paths, batch.captions)]
            return rows, [failure for _, failures in batches for failure in failures]

        assert flat(fast) == flat(grouped)
        assert all(batch is None or len(batch) <= batch_size for batch, _ in fast)
    rows, failures = flat(fast)
    assert all(path == f"{source_location}:{1001 + int(text.split()[1])}" for path, text in rows)
    assert len(rows) + len(failures) == 103 and all(reason == "empty caption" for _, reason in failures)


def test_text_job_with_null_captions_lists_them_and_embeds_the_rest(tmp_path, checkpoint, stock_model):
    import open_clip

    captions = ["a dog", None, "two cats", None, None, "a bird", "the last one"]
    path = tmp_path / "captions.parquet"
    pq.write_table(pa.table({"caption": captions}), path)
    summary = clip_flash.embed(path, tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu", patch=False,
                               normalize=False, out_dtype="float32", shard_size=4, batch_size=2, progress=False)
    assert (summary.rows, summary.failures) == (4, 3)
    output = read_output(tmp_path / "out")
    kept = [text for text in captions if text is not None]
    assert output["metadata"] == {"caption": kept, "id": [f"{path.resolve()}:{row}" for row in (1, 3, 6, 7)]}
    assert [(failure["path"], failure["reason"]) for failure in output["failures"]] == [
        (f"{path.resolve()}:{row}", "empty caption") for row in (2, 4, 5)]
    model, _ = stock_model
    with torch.no_grad():
        expected = model.encode_text(open_clip.get_tokenizer(MODEL)(kept))
    np.testing.assert_allclose(output["text_emb"], expected.numpy(), atol=1e-5)
