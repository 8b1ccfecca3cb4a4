"""nvJPEG's first calls made while a decode="gpu" job's model loads (:mod:`clip_flash.jobs.gpu_decoders_ahead`):
sized like the job's preparer, and never fatal where they cannot run."""
from __future__ import annotations

import logging

import torch

from clip_flash.jobs.gpu_decoders_ahead import GpuDecodersWarmUp
from clip_flash.jobs.runner import nvjpeg_decoders
from clip_flash.jobs.pipeline import DEFAULT_DECODE_THREADS


def test_one_hardware_decoder_per_decoding_thread_up_to_nvjpegs_eight():
    assert nvjpeg_decoders(None) == DEFAULT_DECODE_THREADS
    assert [nvjpeg_decoders(threads) for threads in (1, 3, 8, 12)] == [1, 3, 8, 8]


def test_where_nvjpeg_cannot_run_it_is_logged_not_raised(caplog):
    """On a device without nvJPEG (here the CPU) the background calls fail; the job's warm-up then makes them."""
    with caplog.at_level(logging.DEBUG, logger="clip_flash.jobs.gpu_decoders_ahead"):
        ahead = GpuDecodersWarmUp(torch.device("cpu"), 2).start()
        ahead.join()
    assert not ahead.hardware_decoded and ahead.seconds > 0
    assert "nvJPEG's decoders made ready" in caplog.text and "hardware decoder: not here" in caplog.text
