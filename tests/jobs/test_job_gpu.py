"""The job on a CUDA GPU (skipped without one): the pipelined job (side stream, pinned copies, batches in
flight) writes the rows the same model gives on the same batches without any pipelining."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

import clip_flash
from clip_flash.jobs import job as job_module, warm_up
from .job_helpers import read_output, write_photos

pytestmark = pytest.mark.gpu

GPU_MODEL = "ViT-B-32"


def _reference_rows(paths, captions, batches, decode="cpu"):
    """The same model (same seed), patched, fp16, fed batch by batch with no pipelining at all; every image batch
    choosing its attention kernels as a graph's capture does, as the job's batches do, replayed or eager."""
    from clip_flash.backends import choosing_for_replay
    from clip_flash.models.model_spec import load_model, parse_model_spec
    from clip_flash.inputs.image.preprocessor import ImagePreprocessor

    loaded = load_model(parse_model_spec(GPU_MODEL), torch.device("cuda"), "fp16")
    clip_flash.patch(loaded.model)
    tokenizer = clip_flash.get_tokenizer(GPU_MODEL)
    images, texts = [], []
    with ImagePreprocessor(loaded.preprocess, device="cuda", dtype=torch.float16, decode=decode,
                           workers=4, executor="thread") as prep, \
            torch.inference_mode():
        for start, stop in batches:
            prepared = prep(paths[start:stop])
            assert not prepared.failures
            with choosing_for_replay():
                images.append(loaded.model.encode_image(prepared.pixels).float().cpu())
            if captions is not None:
                texts.append(loaded.model.encode_text(tokenizer(captions[start:stop]).cuda()).float().cpu())
    return torch.cat(images).numpy(), (torch.cat(texts).numpy() if texts else None)


def _batches(count, shard_size, batch_size):
    return [(start, min(start + batch_size, shard_start + shard_size, count))
            for shard_start in range(0, count, shard_size)
            for start in range(shard_start, min(shard_start + shard_size, count), batch_size)]


@pytest.mark.parametrize("cuda_graphs, graph_kept", [(True, True), (True, False), (False, False)],
                         ids=["graph-kept", "graph-dropped", "no-cuda-graphs"])
def test_pipelined_gpu_job_equals_unpipelined_batches(tmp_path, monkeypatch, cuda_graphs, graph_kept):
    """The same rows whether the run's image graph is kept, dropped on its timings, or not asked for."""
    from clip_flash.graphs import GraphedEncoder

    replayed = []
    encode_image = GraphedEncoder.encode_image

    def counted(self, images, normalize=False):
        replayed.append(images.shape[0])
        return encode_image(self, images, normalize)

    monkeypatch.setattr(GraphedEncoder, "encode_image", counted)
    monkeypatch.setattr(warm_up, "GRAPH_MIN_BATCHES_LEFT", 0)  # a run this short would not capture at all
    # the probe's launch share against 0 (always above: kept) or 2 (always below: dropped)
    monkeypatch.setattr(warm_up, "GRAPH_LAUNCH_SHARE", 0.0 if graph_kept else 2.0)
    paths = write_photos(tmp_path / "photos", count=45)
    ordered = sorted(paths, key=lambda path: path.relative_to(tmp_path / "photos").as_posix())
    captions = [path.with_suffix(".txt").read_text() for path in ordered]
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", GPU_MODEL, device="cuda", normalize=False,
                               out_dtype="float32", shard_size=20, batch_size=8, cuda_graphs=cuda_graphs,
                               progress=False)
    assert summary.rows == 45 and summary.precision == "fp16" and summary.patched and summary.gpu_peak_mib > 0
    # Full batches (two per shard of 20, batches of 8): the first runs eager, the second eager and timed (kept:
    # the third captures the graph and it and the fourth go through it; the rest run eager). Rows equal any way.
    assert replayed == ([8] * 2 if graph_kept else [])
    recorded = json.loads(open(summary.record_path).read())["options"]
    assert recorded["image_cuda_graphs"] is graph_kept
    assert recorded["first_batches_decoded_beside_the_load"]  # the rows below are those of the feed made ahead
    output = read_output(tmp_path / "out")
    # Batches (0, 8) (8, 16) (16, 20) | (20, 28) (28, 36) (36, 40) | (40, 45): the full ones at 3 and 4 replayed
    # where the graph is kept, all eager otherwise; the same rows.
    images, texts = _reference_rows([str(path) for path in ordered], captions, _batches(45, 20, 8))
    np.testing.assert_array_equal(output["img_emb"], images)
    np.testing.assert_array_equal(output["text_emb"], texts)
    assert output["metadata"]["image_path"] == [str(path) for path in ordered]


def test_the_image_graph_is_chosen_on_the_runs_own_batches(tmp_path, monkeypatch):
    """The device half of the warm-up runs inside the run (its reader already decoding), before any launch, and
    spends no batch on the image graph: the run's first two full batches run eager (the second timed), the
    third captures the graph."""
    from clip_flash.graphs.capture import CaptureSpace
    from clip_flash.jobs.pipeline import EmbeddingPipeline

    events = []
    capture, run, launch = CaptureSpace.capture, EmbeddingPipeline.run, EmbeddingPipeline._launch

    def capturing(self, key, function, warmup_iters):
        events.append(("capture", key.tower, key.batch))
        return capture(self, key, function, warmup_iters)

    def running(self, *args, **kwargs):
        events.append(("run",))
        return run(self, *args, **kwargs)

    def launching(self, *args, **kwargs):
        events.append(("launch",))
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(CaptureSpace, "capture", capturing)
    monkeypatch.setattr(EmbeddingPipeline, "run", running)
    monkeypatch.setattr(EmbeddingPipeline, "_launch", launching)
    monkeypatch.setattr(warm_up, "GRAPH_MIN_BATCHES_LEFT", 0)  # a run this short would not capture at all
    write_photos(tmp_path / "photos", count=40, captions=False)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", GPU_MODEL, device="cuda", shard_size=20,
                               batch_size=8, progress=False)
    assert summary.rows == 40
    # launches: shard 1's 8 (eager), 8 (eager, timed), 4; shard 2's 8 (the capture), 8, 4
    assert events[:6] == [("run",)] + [("launch",)] * 4 + [("capture", "image", 8)]
    assert events.count(("capture", "image", 8)) == 1
    assert summary.main_thread_seconds["warming up the device"] > 0
    assert 0 < summary.warm_up_seconds < summary.setup_seconds + summary.seconds


def test_a_short_run_does_not_capture_the_image_graph(tmp_path, monkeypatch):
    """Five full batches: too few for a capture (which holds the main thread for many eager launches) to pay."""
    from clip_flash.graphs.capture import CaptureSpace

    captures = []
    capture = CaptureSpace.capture

    def capturing(self, key, function, warmup_iters):
        captures.append(key.tower)
        return capture(self, key, function, warmup_iters)

    monkeypatch.setattr(CaptureSpace, "capture", capturing)
    write_photos(tmp_path / "photos", count=40, captions=False)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", GPU_MODEL, device="cuda", shard_size=20,
                               batch_size=8, progress=False)
    assert summary.rows == 40 and "image" not in captures
    assert json.loads(open(summary.record_path).read())["options"]["image_cuda_graphs"] is False
    assert 0 < summary.after_load_seconds < summary.setup_seconds + summary.seconds


def _smooth_jpegs(folder, count=12, seed=0):
    """Photo-like JPEGs (smooth colour fields, mild noise, web sizes): what nvJPEG's deviation was measured on."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for index in range(count):
        height, width = int(rng.integers(240, 481)), int(rng.integers(320, 641))
        y, x = np.mgrid[0:height, 0:width] / max(height, width)
        channels = [np.sin(x * rng.uniform(2, 8) + rng.uniform(0, 6)) * np.cos(y * rng.uniform(2, 8)) for _ in range(3)]
        pixels = (np.stack(channels, -1) * 100 + 128 + rng.normal(0, 4, (height, width, 3))).clip(0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index:02d}.jpg", quality=90)


def test_gpu_decode_job_is_close_to_the_exact_job(tmp_path):
    _smooth_jpegs(tmp_path / "photos")
    for decode in ("cpu", "gpu"):
        clip_flash.embed(tmp_path / "photos", tmp_path / decode, GPU_MODEL, device="cuda", decode=decode,
                         progress=False)
    exact = read_output(tmp_path / "cpu")["img_emb"].astype(np.float32)
    fast = read_output(tmp_path / "gpu")["img_emb"].astype(np.float32)
    cosine = (exact * fast).sum(1) / (np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1))
    assert exact.shape == fast.shape == (12, 512)
    assert cosine.min() > 0.99, f"nvJPEG path: min cosine {cosine.min():.5f} against the exact path"


def test_a_gpu_decode_job_makes_nvjpeg_ready_while_its_model_loads(tmp_path, monkeypatch):
    """decode="gpu": nvJPEG's first calls are made beside the model load (recorded in the run's options), and the
    run's rows are those of a run whose own warm-up makes them."""
    from clip_flash.inputs.image import nvjpeg_packed
    from clip_flash.jobs.gpu_decoders_ahead import GpuDecodersWarmUp

    _smooth_jpegs(tmp_path / "photos")
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "ahead", GPU_MODEL, device="cuda", decode="gpu",
                               progress=False)
    recorded = json.loads(open(summary.record_path).read())["options"]
    ready = recorded["nvjpeg_made_ready_before_the_run"]
    assert recorded["first_batches_decoded_beside_the_load"]  # after nvJPEG's first calls, before the run
    assert "synthetic images decoded and prepared" not in summary.warm_up_steps  # the run's decoders made them
    assert ready["seconds"] > 0
    assert ready["hardware_decoder"] == nvjpeg_packed.hardware_decoder_usable()
    if torch.cuda.get_device_capability() in ((8, 0), (9, 0)):  # a hardware JPEG decoder: the route must run
        assert ready["hardware_decoder"]
    monkeypatch.setattr(GpuDecodersWarmUp, "_work", lambda self: None)
    clip_flash.embed(tmp_path / "photos", tmp_path / "in_run", GPU_MODEL, device="cuda", decode="gpu",
                     progress=False)
    np.testing.assert_array_equal(read_output(tmp_path / "ahead")["img_emb"],
                                  read_output(tmp_path / "in_run")["img_emb"])


def test_the_device_first_uses_are_made_while_the_model_loads_and_change_no_row(tmp_path, monkeypatch):
    """The encoder's kernels (a one-block stand-in of the model's tower, at the run's batch) and the image path's
    (a stand-in preparer) are made beside the model load, as the run's record says, and the run's warm-up skips
    them; the rows equal those of a run that makes them itself."""
    from clip_flash.jobs.device_ahead import DeviceFirstUses

    write_photos(tmp_path / "photos", count=20)
    options = dict(device="cuda", normalize=False, out_dtype="float32", batch_size=8, progress=False)
    towers_on = []
    vision_tower = DeviceFirstUses._vision_tower

    def recording_tower(self, *args):
        towers_on.append(threading.get_ident())
        return vision_tower(self, *args)

    monkeypatch.setattr(DeviceFirstUses, "_vision_tower", recording_tower)
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "ahead", GPU_MODEL, **options)
    # on the thread that launches the run's batches (the caller's): cuDNN keeps its attention plans per thread
    assert towers_on == [threading.get_ident()]
    made = json.loads(open(summary.record_path).read())["options"]["device_first_uses_made_before_the_run"]
    assert set(made["steps"]) == {"vision tower of one block", "image path on synthetic images"}
    assert made["seconds"] > 0
    assert set(summary.warm_up_steps) == {"text encoder"}  # the run's warm-up does not make them again
    monkeypatch.setattr(DeviceFirstUses, "_work", lambda self: None)
    monkeypatch.setattr(DeviceFirstUses, "make_encoder_first_uses", lambda self: None)
    monkeypatch.setattr(job_module, "feed_ahead", lambda *args, **kwargs: None)  # its decoding would make some
    in_run = clip_flash.embed(tmp_path / "photos", tmp_path / "in_run", GPU_MODEL, **options)
    assert set(in_run.warm_up_steps) == {"synthetic images decoded and prepared", "image encoder on one row",
                                         "text encoder"}
    ahead, in_run = read_output(tmp_path / "ahead"), read_output(tmp_path / "in_run")
    np.testing.assert_array_equal(ahead["img_emb"], in_run["img_emb"])
    np.testing.assert_array_equal(ahead["text_emb"], in_run["text_emb"])


def test_gpu_caption_job_equals_unpipelined_text_encoding(tmp_path):
    from clip_flash.models.model_spec import load_model, parse_model_spec
    from benchmarks.harness.workloads import caption_prompts

    captions = caption_prompts(3000, seed=1)
    (tmp_path / "captions.txt").write_text("\n".join(captions) + "\n")
    clip_flash.embed(tmp_path / "captions.txt", tmp_path / "out", GPU_MODEL, device="cuda", normalize=False,
                     out_dtype="float32", shard_size=1500, batch_size=512, progress=False)
    loaded = load_model(parse_model_spec(GPU_MODEL), torch.device("cuda"), "fp16")
    clip_flash.patch(loaded.model)
    tokenizer = clip_flash.get_tokenizer(GPU_MODEL)
    with torch.inference_mode():
        expected = torch.cat([loaded.model.encode_text(tokenizer(captions[start:stop]).cuda()).float().cpu()
                              for start, stop in _batches(3000, 1500, 512)]).numpy()
    np.testing.assert_array_equal(read_output(tmp_path / "out")["text_emb"], expected)


def test_the_encoders_warm_up_beside_the_synthetic_images_and_their_errors_reach_the_caller():
    """The device warm-up calls each encoder once, on a thread of its own, while the main thread prepares the
    synthetic images; an encoder's failure there is raised by the warm-up, not lost with its thread."""
    import threading

    from clip_flash.jobs.runner import make_runner
    from clip_flash.jobs.items import Source
    from clip_flash.models.model_spec import load_model, parse_model_spec

    loaded = load_model(parse_model_spec(GPU_MODEL), torch.device("cuda"), "fp16")
    clip_flash.patch(loaded.model)
    source = Source("unused", has_images=True, has_captions=True)
    pipeline = make_runner(loaded, source, torch.device("cuda"), "clip_flash", "cpu", 8, True, "float16", 2)
    calls = []
    encode_image, encode_text = loaded.model.encode_image, loaded.model.encode_text

    def noting(name, encode):
        def call(*args, **kwargs):
            calls.append((name, threading.current_thread().name, torch.is_inference_mode_enabled()))
            return encode(*args, **kwargs)
        return call

    loaded.model.encode_image, loaded.model.encode_text = noting("image", encode_image), noting("text", encode_text)
    try:
        steps = {}
        assert warm_up.warm_up_device(pipeline, steps=steps) > 0
        assert set(steps) == {"synthetic images decoded and prepared", "image encoder on one row", "text encoder"}
        assert sorted(calls) == [("image", "clip_flash-warm-up-encoders", True),
                                 ("text", "clip_flash-warm-up-encoders", True)]

        def failing(*args, **kwargs):
            raise RuntimeError("the encoder failed")

        loaded.model.encode_image = failing
        with pytest.raises(RuntimeError, match="the encoder failed"):
            warm_up.warm_up_device(pipeline)
    finally:
        loaded.model.encode_image, loaded.model.encode_text = encode_image, encode_text
        pipeline.close()
