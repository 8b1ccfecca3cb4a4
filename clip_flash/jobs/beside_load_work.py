"""What a job starts beside its model load, one function a kind of work, each None where the job has no use for it.

None of it needs the model (see :mod:`.beside_load`): page-locked blocks for the first batches
(:mod:`.pinned_reserve`), the inputs' checks and tokenizer (:mod:`.inputs_ahead`), the device's first uses on
stand-ins (:mod:`.device_ahead`), nvJPEG's first calls (:mod:`.gpu_decoders_ahead`) and the run's first batches
themselves (:mod:`.feed_ahead`). ``embed()`` and the Ray actor start these before the load and join them after it.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional, Sequence

import torch

from .device_ahead import DeviceFirstUses
from .feed_ahead import FeedAhead, expected_model
from .inputs_ahead import InputsAhead
from .pinned_reserve import PinnedReservation
from .pipeline import DEFAULT_DECODE_THREADS, DEFAULT_PREFETCH_BATCHES, input_blocks_alive
from .runner import build_inputs, nvjpeg_decoders


def inputs_ahead(model_name: str, source: Any, pipeline: str) -> Optional[InputsAhead]:
    """A started :class:`~clip_flash.jobs.inputs_ahead.InputsAhead` for clip_flash's inputs (None for the stock
    baseline, which makes OpenCLIP's own)."""
    if pipeline != "clip_flash":
        return None
    return InputsAhead(model_name, source.has_images, source.has_captions).start()


def device_first_uses(job: Any, source: Any, device: torch.device, pipeline: str, decode: str, batch_size: int,
                      decode_threads: Optional[int], ahead: Optional[InputsAhead]) -> Optional[DeviceFirstUses]:
    """A started :class:`~clip_flash.jobs.device_ahead.DeviceFirstUses` for clip_flash's image runs on CUDA (None
    otherwise): the encoder's kernels at the run's batch and, with ``decode="cpu"``, the image path's, made on
    stand-ins while the model loads (``decode="gpu"`` makes nvJPEG's in :mod:`.gpu_decoders_ahead`). ``join()`` it
    before the run. ``job``: its ``spec``, ``precision`` and ``patch``."""
    if not (device.type == "cuda" and source.has_images and pipeline == "clip_flash"):
        return None
    return DeviceFirstUses(job.spec.name, device, job.precision, batch_size, job.patch, image_path=decode == "cpu",
                           decode_threads=decode_threads or DEFAULT_DECODE_THREADS, inputs=ahead).start()


def feed_ahead(job: Any, device: torch.device, pipeline: str, decode: str, batch_size: int, workers: Optional[int],
               executor: str, decode_threads: Optional[int], exact_share: float, ahead: Optional[InputsAhead],
               after: Sequence[Any]) -> Optional[FeedAhead]:
    """A started :class:`~.feed_ahead.FeedAhead` of the job's shards for clip_flash's pipeline (None for the stock
    baseline): the run's first batches decoded while the model loads, after the work in ``after``."""
    if pipeline != "clip_flash":
        return None
    from clip_flash.models import PRECISION_DTYPES

    dtype = PRECISION_DTYPES[job.precision]
    threads = decode_threads or DEFAULT_DECODE_THREADS
    build = lambda expected: build_inputs(expected_model(expected, job.spec, dtype), job.source, device,  # noqa: E731
                                          decode, workers, executor, threads, exact_share, ahead)
    return FeedAhead(job.spec, job.todo, build, batch_size, threads, DEFAULT_PREFETCH_BATCHES,
                     pin_tokens=device.type == "cuda", after=[work for work in after if work is not None]).start()


def reserve_pinned_blocks(device: torch.device, has_images: bool, pipeline: str, decode: str, batch_size: int,
                          exact_share: float, executor: str,
                          first_images: Callable[[int], Sequence[Any]]) -> Optional[PinnedReservation]:
    """A started :class:`~clip_flash.jobs.pinned_reserve.PinnedReservation` for a run whose batches put JPEG
    coefficients in page-locked blocks (None otherwise): blocks for the batches alive at once (queued, launching,
    uploading), the size the exact route's share of the run's first batch asks for (``first_images(count)``: its
    first images, paths or bytes; called in the reservation's thread), made while the model loads. ``join()`` it
    before the run."""
    exact_images = exact_images_per_batch(decode, batch_size, exact_share)
    if not (device.type == "cuda" and has_images and pipeline == "clip_flash" and exact_images
            and executor != "thread"):
        return None
    return PinnedReservation(exact_images, input_blocks_alive(),
                             first_images=partial(first_images, exact_images)).start()


def exact_images_per_batch(decode: str, batch_size: int, exact_share: float) -> int:
    """How many of a full batch's images take the exact route (each batch's coefficients go into one page-locked
    block sized by them): all with decode="cpu"; with "gpu", the exact share's."""
    from clip_flash.inputs.image.exact_share import exact_positions

    return batch_size if decode == "cpu" else len(exact_positions(batch_size, exact_share))


def gpu_decoders_ahead(device: torch.device, source: Any, pipeline: str, decode: str,
                       decode_threads: Optional[int]) -> Optional[Any]:
    """A started :class:`~.gpu_decoders_ahead.GpuDecodersWarmUp` for clip_flash's ``decode="gpu"`` image runs on CUDA
    (None otherwise): nvJPEG's first calls (its library, the hardware decoder's states, torchvision's decoder), one per
    decoding thread, as :func:`~.runner.build_inputs` sizes the preparer's."""
    if not (device.type == "cuda" and source.has_images and pipeline == "clip_flash" and decode == "gpu"):
        return None
    from .gpu_decoders_ahead import GpuDecodersWarmUp

    return GpuDecodersWarmUp(device, nvjpeg_decoders(decode_threads)).start()

