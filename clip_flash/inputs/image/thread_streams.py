"""One CUDA stream per thread and device, for the device work the decoding threads queue ahead of the batch.

The calls that queue it (nvJPEG's hardware decode, the resize of a batch's layouts) wait for their own stream,
so threads sharing one would wait for each other's batches too.
"""
from __future__ import annotations

import threading

import torch

_streams = threading.local()


def thread_stream(device: torch.device) -> "torch.cuda.Stream":
    """This thread's stream on ``device``, made on its first use here."""
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]
