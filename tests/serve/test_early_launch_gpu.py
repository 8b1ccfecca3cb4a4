"""The server's image batcher with the real gate and exact preparer on a GPU: lone requests launched while their
JPEGs decode get the rows of the usual launch bit for bit, bad and truncated files included."""
from __future__ import annotations

import asyncio
import io
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from clip_flash.serve.batcher import TowerBatcher
from clip_flash.serve.jobs import Embedded, EmbeddingJob, ItemError, QueuedInputs


def _jpeg(width: int, height: int, seed: int, **options) -> bytes:
    rng = np.random.default_rng(seed)
    gradient = np.linspace(0, 255, width * height * 3).reshape(height, width, 3)
    pixels = np.clip(gradient + rng.normal(0, 40, gradient.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", **options)
    return out.getvalue()


def _answers(launch_early: bool, requests):
    from open_clip.transform import image_transform

    from clip_flash.serve.inputs import FastImageInputs

    inputs = FastImageInputs(image_transform(224, is_train=False), torch.device("cuda", torch.cuda.current_device()),
                             torch.float16, "cpu", 4, 8)
    if launch_early and not inputs.launches_early:
        pytest.skip("the native decoder or the resize kernel is not available")
    lock, used = threading.Lock(), []

    def encode(x):  # every pixel's bits reach the answer
        return x.float().flatten(1)

    batcher = TowerBatcher("image", inputs, encode, max_batch=8, max_wait=0.002, lock=lock,
                           on_dequeue=lambda count: None, device=torch.device("cuda", torch.cuda.current_device()),
                           launch_early=launch_early)
    if launch_early:
        assert batcher._gate is not None
        inputs_device_early = inputs.device_early

        def counted(layout):
            used.append(1)
            return inputs_device_early(layout)

        inputs.device_early = counted

    async def main():
        loop = asyncio.get_running_loop()
        jobs = []
        for payloads in requests:  # one at a time: each batch alone
            job = EmbeddingJob(loop, len(payloads), time.monotonic() + 60)
            with lock:
                batcher.put_locked([QueuedInputs(job, list(range(len(payloads))), payloads)], time.monotonic())
            await asyncio.wait_for(job.future, 60)
            jobs.append(job)
        return jobs

    try:
        jobs = asyncio.run(main())
    finally:
        batcher.close()
        inputs.close()
    return jobs, len(used)


def test_lone_requests_launched_early_get_the_usual_rows_bit_for_bit():
    good = [_jpeg(640, 480, 0, quality=90), _jpeg(333, 500, 1, quality=75, subsampling=1),
            _jpeg(800, 600, 2, quality=95, progressive=True)]
    truncated = good[0][: len(good[0]) // 2]  # libjpeg warns: Pillow decides (it fails the image)
    requests = [[good[0]], [good[1]], [good[2]], [b"not an image"], [truncated], [good[0], b"junk", good[1]]]
    early, launched_early = _answers(True, requests)
    usual, _ = _answers(False, requests)
    assert launched_early >= 4
    for early_job, usual_job in zip(early, usual):
        for mine, theirs in zip(early_job.results, usual_job.results):
            assert type(mine) is type(theirs)
            if isinstance(mine, Embedded):
                assert np.array_equal(mine.raw, theirs.raw)
            else:
                assert isinstance(mine, ItemError) and mine.message == theirs.message
    assert all(isinstance(result, Embedded) for job in early[:3] for result in job.results)
    assert isinstance(early[3].results[0], ItemError)
    assert isinstance(early[5].results[1], ItemError) and isinstance(early[5].results[2], Embedded)
