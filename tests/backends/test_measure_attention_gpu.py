"""The attention measurement on a GPU: device times (the kernel alone, the device kept busy ahead) are what a
CUDA graph's replay pays, and a patched model captured into a graph runs the table's device-time winner."""
from __future__ import annotations

import torch

from clip_flash.backends import measure_attention
from clip_flash.backends.measured import being_captured, choosing_for_replay


def test_device_times_are_the_kernels_alone_under_the_eager_times():
    """At batch 1 an eager call is mostly its launch: the device time is well under it, and never above it."""
    shape = measure_attention.Shape("float16", False, False, 1, 257, 16, 64)
    names = measure_attention.backends_to_time(["sdpa:flash", "sdpa:efficient", "sdpa:cudnn"], False)
    result = measure_attention.measure_shape(shape, ["ViT-L-14"], names, repeats=20, warmup=3,
                                             device=torch.device("cuda"))
    timed = [name for name, ms in result.ms.items() if ms is not None]
    assert timed, result.errors
    for name in timed:
        assert 0 < result.device_ms[name] <= result.ms[name] * 1.05, (name, result.ms, result.device_ms)
    # A 16-head 257-token attention is some microseconds of work; the eager call adds its launch on top.
    assert min(result.device_ms[name] for name in timed) < 0.05
    assert result.best_replayed in timed and result.to_entry()["best_replayed"] == result.best_replayed


def test_only_clip_flash_captures_choose_for_replay():
    """A graph captured outside clip_flash (its warm-up eager) records the eager choice; inside
    choosing_for_replay (clip_flash's warm-up and capture) the replay choice."""
    q = torch.empty(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    assert not being_captured(q)
    seen = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen.append(being_captured(q))
        with choosing_for_replay():
            seen.append(being_captured(q))
        q.add_(1)  # something to capture
    assert seen == [False, True] and not being_captured(q)
