"""Inputs as users have them: captions on some images only, tars whose first sample has no caption, caption
files with odd line ends and blank lines, names that are not UTF-8, a FIFO where a caption should be."""
from __future__ import annotations

import logging
import os
import threading

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

import clip_flash
from clip_flash.jobs.caption_file import read_captions
from clip_flash.jobs.sources import SourceError
from .job_helpers import MODEL, read_output, write_photos
from .test_job_sources import _write_tar


def test_webdataset_reads_captions_where_any_sample_has_one(tmp_path, checkpoint):
    """The first tar unreadable, the next one's first sample without a caption: captions are still read, per
    sample (an empty caption where a sample has none)."""
    jpegs = [path.read_bytes() for path in write_photos(tmp_path / "photos", count=3, captions=False)]
    (tmp_path / "0.tar").write_bytes(b"this is not a tar" * 100)
    _write_tar(tmp_path / "1.tar", [("a.jpg", jpegs[0]), ("b.jpg", jpegs[1]), ("b.txt", b"second"),
                                    ("c.jpg", jpegs[2]), ("c.json", b'{"caption": "third"}')])
    summary = clip_flash.embed(str(tmp_path / "{0,1}.tar"), tmp_path / "out", f"{MODEL}::{checkpoint}",
                               device="cpu", progress=False)
    output = read_output(tmp_path / "out")
    assert output["metadata"]["caption"] == ["", "second", "third"]
    assert output["text_emb"].shape[0] == 3 and summary.rows == 3
    assert [row["shard"] for row in output["failures"]] == ["0"]  # the unreadable tar, with its own reason
    assert "tar read error" in output["failures"][0]["reason"]
    clip_flash.embed(str(tmp_path / "1.tar"), tmp_path / "pairs", f"{MODEL}::{checkpoint}", device="cpu",
                     require_captions=True, progress=False)
    assert read_output(tmp_path / "pairs")["metadata"]["key"] == ["b", "c"]


def test_text_file_splits_at_line_ends_only(tmp_path):
    captions = ["form\x0bfeed\x0c", "group\x1dsep", "next\x85line", "line\u2028separator", "para\u2029graph"]
    path = tmp_path / "c.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(captions).encode() + b"\n")
    assert read_captions(path).captions == captions
    path.write_bytes("\n".join(captions).encode())  # no final newline
    assert read_captions(path).captions == captions


def test_binary_caption_column_is_refused(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption": pa.array([b"a dog", b"a cat"], type=pa.binary())}), path)
    with pytest.raises(SourceError, match="holds bytes.*not text"):
        read_captions(path)


def test_blank_lines_and_nulls_are_empty_caption_failures_and_rows_keep_their_ids(tmp_path, checkpoint, caplog):
    model = f"{MODEL}::{checkpoint}"
    path = tmp_path / "c.txt"
    path.write_bytes(b"a dog\n\n   \t\nbad \xff byte\na cat\n")
    with caplog.at_level(logging.WARNING, logger="clip_flash"):
        summary = clip_flash.embed(path, tmp_path / "txt", model, device="cpu", caption_column="caption",
                                   progress=False)
    assert any("caption column 'caption' ignored: c.txt holds one caption per line" in record.getMessage()
               for record in caplog.records)
    output = read_output(tmp_path / "txt")
    assert output["metadata"] == {"caption": ["a dog", "a cat"], "id": [f"{path}:1", f"{path}:5"]}
    failures = {row["path"]: row["reason"] for row in output["failures"]}
    assert failures[f"{path}:2"] == failures[f"{path}:3"] == "empty caption"
    assert "line 4 of c.txt is not UTF-8" in failures[f"{path}:4"]
    assert (summary.rows, summary.failures, summary.failures_total) == (2, 3, 3)

    table = tmp_path / "c.csv"
    pa_csv.write_csv(pa.table({"id": ["k1", "k2", "k3", "k4"], "caption": ["a dog", " ", None, "a cat"]}), table)
    summary = clip_flash.embed(table, tmp_path / "csv", model, device="cpu", progress=False)
    output = read_output(tmp_path / "csv")
    assert output["metadata"] == {"caption": ["a dog", "a cat"], "id": ["k1", "k4"]}
    assert [(row["path"], row["reason"]) for row in output["failures"]] == [("k2", "empty caption"),
                                                                            ("k3", "empty caption")]
    assert summary.failures == 2


def test_names_that_are_not_utf8_are_stored_escaped_and_the_job_finishes(tmp_path, checkpoint):
    photos = write_photos(tmp_path / "photos", count=2, captions=False)
    odd = os.fsdecode(os.fsencode(str(tmp_path / "photos")) + b"/caf\xe9.jpg")
    os.rename(photos[0], odd)
    os.fsencode(odd)
    with open(os.fsencode(odd)[:-4] + b".txt", "wb") as handle:
        handle.write(b"un caf\xc3\xa9")
    _write_tar(tmp_path / "a.tar", [(os.fsdecode(b"k\xff.jpg"), photos[1].read_bytes())])
    for source, out in ((tmp_path / "photos", "folder"), (tmp_path / "a.tar", "tar")):
        clip_flash.embed(str(source), tmp_path / out, f"{MODEL}::{checkpoint}", device="cpu", progress=False)
        # and again: a rerun over the finished folder skips it rather than stopping on the name
        assert clip_flash.embed(str(source), tmp_path / out, f"{MODEL}::{checkpoint}", device="cpu",
                                progress=False).shards_skipped == 1
    folder = read_output(tmp_path / "folder")["metadata"]
    assert str(tmp_path / "photos" / "caf\\xe9.jpg") in folder["image_path"]
    assert "un café" in folder["caption"]
    assert read_output(tmp_path / "tar")["metadata"]["key"] == ["k\\xff"]


def test_a_fifo_named_as_a_caption_is_not_read_and_a_bad_caption_is_named(tmp_path, checkpoint):
    paths = write_photos(tmp_path / "photos", count=3)
    paths[0].with_suffix(".txt").unlink()
    os.mkfifo(paths[0].with_suffix(".txt"))  # opening it to read would wait for a writer forever
    paths[2].with_suffix(".txt").write_bytes(b"first line\nsecond \xff line\n")
    result = {}

    def job():
        result["summary"] = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}",
                                             device="cpu", progress=False)

    worker = threading.Thread(target=job, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert "summary" in result, "the job blocked on the FIFO"
    failures = {row["path"]: row["reason"] for row in read_output(tmp_path / "out")["failures"]}
    assert set(failures) == {str(paths[0]), str(paths[2])}
    assert f"caption {paths[0].stem}.txt is a FIFO, not a regular file" in failures[str(paths[0])]
    assert f"caption {paths[2].stem}.txt is not UTF-8: line 2" in failures[str(paths[2])]
