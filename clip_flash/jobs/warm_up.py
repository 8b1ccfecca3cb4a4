"""What a pipeline's first batch would otherwise pay once, paid on inputs of its own.

The first batch of a run is the first use of everything on its path: the decoder's native threads and
Pillow's libjpeg, the kernels of the decode and resize path (CUDA loads each module on its first launch), the
nvJPEG decoders of ``decode="gpu"`` (the hardware decoder's states, one per decoding thread, and torchvision's
decoder for the JPEGs it leaves), cuBLAS's and cuDNN's first calls. None of it depends on the job's inputs, so
it is done on a few synthetic images and a row of zeros, in two halves:

- :func:`start_decoder` (the CPU half) before the run: the decoder's threads must exist before the first read.
- :func:`warm_up_device` (the device half, the synthetic images' preparation beside the encoders' first calls):
  in a job, at the start of the run, on the main thread while the run's own threads already read and decode the
  first batches (the page-locked blocks those batches need are made meanwhile), so the GPU's warm-up and the
  first reads overlap instead of adding up; a Ray actor does it with its model load, before it takes shards.
  Either way it is inside the accounts: the job's rate "after the model load" counts it. Most of what it would
  pay (kernels and libraries, loaded once a process) is made while the model loads, on stand-ins
  (:mod:`.device_ahead`), so it finds them done.

Whether full image batches replay a CUDA graph is decided in the run, on its own batches
(:func:`eager_batch_deciding_graphs`): the first full batch runs eager (it pays its kernels' first loads), the
second runs eager timed, and where launching it took ``GRAPH_LAUNCH_SHARE`` of its time or more and at least
``GRAPH_MIN_BATCHES_LEFT`` full batches are left to replay it, the third captures the graph the rest replay; else
the graph is dropped. Every batch timed is a batch of the job: a large model, whose graph does not pay, spends no
device time on the choice.
"""
from __future__ import annotations

import io
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from PIL import Image

from ..backends import choosing_for_replay

logger = logging.getLogger(__name__)

WARM_UP_SIZE = (480, 640)  # (height, width): a common photo size, larger than any model's input
WARM_UP_CAPTIONS = 8
# A job replays full image batches from a CUDA graph when launching an eager batch takes at least this share
# of its time (measured on the run's second full batch): measured on an H100 host, ViT-B-32 at batch 256 ran
# 10,900-12,900 img/s replayed and 9,200 eager; ViT-L-14 2,600 and 2,610 (results/h100/job_start_63aab05/).
GRAPH_LAUNCH_SHARE = 0.25
GRAPH_PROBE_BATCH = 2  # the full batch timed: the first pays its kernels' first loads, which are not launches
# Capturing the graph holds the main thread for many eager batches' launching while the decoders' queue fills and
# they stop; a replay then saves a few ms a batch. Measured on an H100 host, ViT-B-32 at batch 256, a fresh
# process: the capture 121.5 ms against 7-12 ms to launch an eager batch, and the job's steady rate 4-12%
# higher with the graph (results/h100/job_start_53a21f4/): it pays after some 40-60 batches, so a run with fewer
# full batches left than this does not capture.
GRAPH_MIN_BATCHES_LEFT = 32


def synthetic_images() -> List[bytes]:
    """In-memory images taking each route a photo may take: a baseline 4:2:0 colour JPEG (the DCT route; on
    ``decode="gpu"`` the hardware decoder), a progressive and a grayscale JPEG (torchvision's nvJPEG on
    ``decode="gpu"``), and an RGB PNG (decoded in Python threads, joining the packed layout)."""
    height, width = WARM_UP_SIZE
    rows = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    columns = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    rgb = np.stack([rows + 0 * columns, columns + 0 * rows, (rows + columns) / 2], axis=-1).astype(np.uint8)
    colour = Image.fromarray(rgb)

    def encoded(image: Image.Image, form: str, **options: Any) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, form, **options)
        return buffer.getvalue()

    return [encoded(colour, "JPEG", quality=90, subsampling=2),
            encoded(colour, "JPEG", quality=90, progressive=True),
            encoded(colour.convert("L"), "JPEG", quality=90),
            encoded(colour, "PNG")]


def start_decoder(pipeline: Any) -> float:
    """Start ``pipeline``'s image decoder (its native threads) and wait for it; returns the seconds spent."""
    started = time.perf_counter()
    start = getattr(pipeline.image_preparer, "start", None)
    if start is not None:
        try:
            start(batch_size=pipeline.batch_size, wait=True)
        except TypeError:  # a preparer of another kind, whose start() does not wait
            start(batch_size=pipeline.batch_size)
    return time.perf_counter() - started


def warm_up_device(pipeline: Any, decode_threads: int = 1, steps: Optional[Dict[str, float]] = None) -> float:
    """The device half on ``pipeline`` (an :class:`~clip_flash.jobs.pipeline.EmbeddingPipeline`) on CUDA: the
    synthetic images decoded by ``decode_threads`` threads at once and prepared, and, in a thread beside them,
    the image encoder on one row of zeros and the text encoder; returns the seconds spent (0 off CUDA) and puts
    each step's end (seconds into the warm-up) in ``steps``, where given.

    The two halves share nothing but the device: the preparation's first kernels and the encoders' (their
    modules' loads, cuBLAS's first handle) each take a few hundred ms on an H100 host, and while the main thread
    waits for them the decoders' queue fills and they stop; side by side they cost the longer of the two.

    A step whose first uses were made on stand-ins while the model loaded (named in the pipeline's
    ``made_beside_load``: :mod:`.device_ahead`) is not made again."""
    if not pipeline.cuda:
        return 0.0
    from .device_ahead import IMAGE_PATH_STEP, VISION_TOWER_STEP

    made = getattr(pipeline, "made_beside_load", frozenset())
    started = time.perf_counter()
    steps = {} if steps is None else steps
    device = pipeline.device
    row_shape = _image_row_shape(pipeline.image_preparer) if VISION_TOWER_STEP not in made else None
    failure: List[BaseException] = []
    encoders = threading.Thread(target=_warm_up_encoders, args=(pipeline, row_shape, steps, started, failure),
                                name="clip_flash-warm-up-encoders", daemon=True)
    encoders.start()
    try:
        with torch.inference_mode():
            if pipeline.image_preparer is not None and IMAGE_PATH_STEP not in made:
                pixels = prepare_synthetic_images(pipeline.image_preparer, pipeline.copy_stream, decode_threads)
                steps["synthetic images decoded and prepared"] = time.perf_counter() - started
                if pixels is not None and row_shape is None and VISION_TOWER_STEP not in made:
                    # a preparer that does not say its rows' shape
                    _encode_images(pipeline, torch.zeros((1, *pixels.shape[1:]), dtype=pixels.dtype,
                                                         device=device))
                    steps["image encoder on one row, after them"] = time.perf_counter() - started
    except BaseException as error:  # noqa: BLE001 - re-raised once the encoders' thread is done
        failure.insert(0, error)
    encoders.join()
    if failure:
        raise failure[0]
    seconds = time.perf_counter() - started
    logger.info("device warmed up in %.2f s (%s)", seconds,
                ", ".join(f"{step} by {step_seconds:.2f} s" for step, step_seconds in steps.items()))
    return seconds


def _image_row_shape(preparer: Any) -> "tuple | None":
    """(channels, height, width, dtype) of the rows ``preparer`` returns, when it says (clip_flash's does)."""
    size, dtype = getattr(preparer, "output_size", None), getattr(preparer, "dtype", None)
    if size is None or dtype is None:
        return None
    height, width = size
    return 3, int(height), int(width), dtype


def _encode_images(pipeline: Any, pixels: torch.Tensor) -> None:
    with choosing_for_replay():  # the kernels the run's batches choose (EmbeddingPipeline._encode_image)
        pipeline._to_host(pipeline._finish(pipeline.model.encode_image(pixels)))
    torch.cuda.current_stream(pipeline.device).synchronize()


def _warm_up_encoders(pipeline: Any, row_shape: "tuple | None", steps: Dict[str, float], started: float,
                      failure: List[BaseException]) -> None:
    """The encoders' first calls (in a thread: its own inference mode and device), each step's end noted in
    ``steps`` as seconds from ``started``; an error appended to ``failure`` for the caller to raise."""
    device = pipeline.device
    try:
        with torch.cuda.device(device), torch.inference_mode():
            if pipeline.image_preparer is not None and row_shape is not None:
                channels, height, width, dtype = row_shape
                _encode_images(pipeline, torch.zeros((1, channels, height, width), dtype=dtype, device=device))
                steps["image encoder on one row"] = time.perf_counter() - started
            if pipeline.tokenizer is not None:
                tokens = pipeline.tokenizer(["a photo"] * WARM_UP_CAPTIONS).pin_memory()
                if not pipeline.host_tokens:
                    tokens = tokens.to(device, non_blocking=True)
                pipeline._to_host(pipeline._finish(pipeline.model.encode_text(tokens)))
                torch.cuda.current_stream(device).synchronize()
                steps["text encoder"] = time.perf_counter() - started
    except BaseException as error:  # noqa: BLE001 - raised by warm_up_device in the caller's thread
        failure.append(error)


def eager_batch_deciding_graphs(pipeline: Any, pixels: torch.Tensor,
                                full_batches_left: Optional[int] = None) -> torch.Tensor:
    """``model.encode_image(pixels)`` for the run's probe batch, eager and timed on its own (the device drained
    before it): the share of its time the host spent launching it decides whether the pipeline's image graph is
    kept (then captured at the next full batch) or dropped. A graph replays those launches in one; when the
    device's work dwarfs them (a large model at a large batch), replaying saves nothing and capturing costs a
    batch of device time; when few batches are left (``full_batches_left`` after this one, None: not known),
    the capture costs more than the replays save."""
    device = pipeline.device
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    features = pipeline.model.encode_image(pixels)
    launched = time.perf_counter()
    torch.cuda.synchronize(device)
    share = (launched - started) / max(time.perf_counter() - started, 1e-9)
    pipeline.image_graphs_decided = True
    few_left = full_batches_left is not None and full_batches_left < GRAPH_MIN_BATCHES_LEFT
    if few_left or share < GRAPH_LAUNCH_SHARE:
        pipeline.image_graphs.release()
        pipeline.image_graphs = None
        why = (f"{full_batches_left} full batches are left, under the {GRAPH_MIN_BATCHES_LEFT} a graph's capture "
               "pays for" if few_left else f"launching an eager batch takes {100 * share:.0f}% of its time, under "
               f"the {100 * GRAPH_LAUNCH_SHARE:.0f}% where a graph's replay pays for its capture")
        logger.info("image batches run eager: %s", why)
    else:
        logger.info("full image batches replay a CUDA graph from the next one: launching an eager batch takes "
                    "%.0f%% of its time", 100 * share)
    return features


def prepare_synthetic_images(preparer: Any, stream: torch.cuda.Stream, threads: int) -> "torch.Tensor | None":
    """The synthetic images decoded by ``preparer`` from ``threads`` threads at once (each gets the per-thread
    state it would make on its first batch), then prepared on ``stream``, as a batch is; the prepared rows (None
    if the preparer returned none)."""
    images = synthetic_images()
    threads = max(1, threads)
    together = threading.Barrier(threads)

    def decode(_: int) -> Any:
        together.wait(timeout=60)
        return preparer.decode(images)

    with ThreadPoolExecutor(threads, thread_name_prefix="clip_flash-warm-up") as pool:
        decoded = list(pool.map(decode, range(threads)))
    pixels = None
    with torch.cuda.stream(stream):
        for batch in decoded:
            prepared = preparer.prepare(batch)
            if prepared.failures:
                logger.debug("warm-up images the preparer refused: %s", prepared.failures)
            if len(prepared.indices):
                pixels = prepared.pixels
    stream.synchronize()
    return pixels
