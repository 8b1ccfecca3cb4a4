"""The order in which a job's full image batches meet the image graph: the first eager, the second the timed
probe that keeps or drops the graph, the rest through the graph if kept (eager if dropped); partial batches eager
throughout. The probe's timing needs CUDA (``tests/jobs/test_job_gpu.py``); the order is checked here."""
from __future__ import annotations

import time

import torch

from clip_flash.jobs import pipeline as pipeline_module, warm_up
from clip_flash.jobs.pipeline import EmbeddingPipeline


class _Model(torch.nn.Module):
    def __init__(self, calls, launch_seconds: float = 0.0):
        super().__init__()
        self.calls = calls
        self.launch_seconds = launch_seconds

    def encode_image(self, pixels):
        self.calls.append(("eager", pixels.shape[0]))
        time.sleep(self.launch_seconds)
        return pixels


class _Graphs:
    def __init__(self, calls):
        self.calls = calls

    def encode_image(self, pixels):
        self.calls.append(("graph", pixels.shape[0]))
        return pixels

    def release(self):
        self.calls.append(("released",))


def _batches_through(monkeypatch, keep: bool, items_left=None):
    calls = []

    def probe(pipeline, pixels, full_batches_left=None):
        calls.append(("probe", pixels.shape[0]))
        calls.append(("left", full_batches_left))
        pipeline.image_graphs_decided = True
        if not keep:
            pipeline.image_graphs.release()
            pipeline.image_graphs = None
        return pixels

    monkeypatch.setattr(pipeline_module, "eager_batch_deciding_graphs", probe)
    pipeline = EmbeddingPipeline(_Model(calls), torch.device("cpu"), batch_size=4)
    pipeline.image_graphs = _Graphs(calls)  # as on CUDA
    pipeline._items_left = items_left  # as a run of known size leaves it when the probe batch launches
    assert not pipeline.image_graphs_replayed
    for rows in (4, 2, 4, 4, 3, 4):
        pipeline._encode_image(torch.zeros(rows, 1))
    return calls, pipeline


def test_a_kept_graph_serves_the_full_batches_after_the_probe(monkeypatch):
    calls, pipeline = _batches_through(monkeypatch, keep=True)
    assert calls == [("eager", 4), ("eager", 2), ("probe", 4), ("left", None), ("graph", 4), ("eager", 3),
                     ("graph", 4)]
    assert pipeline.image_graphs_replayed


def test_a_dropped_graph_leaves_every_batch_eager(monkeypatch):
    calls, pipeline = _batches_through(monkeypatch, keep=False)
    assert calls == [("eager", 4), ("eager", 2), ("probe", 4), ("left", None), ("released",), ("eager", 4),
                     ("eager", 3), ("eager", 4)]
    assert not pipeline.image_graphs_replayed


def test_the_probe_hears_how_many_full_batches_are_left(monkeypatch):
    calls, _ = _batches_through(monkeypatch, keep=True, items_left=42)
    assert ("left", 10) in calls


def _probe_on_cpu(monkeypatch, full_batches_left):
    """The real probe, its device syncs made no-ops (launching is then the whole of its time: a graph pays). The
    launch takes 20 ms, so that a busy machine pausing the test between the probe's clocks cannot make it look
    small."""
    monkeypatch.setattr(warm_up.torch.cuda, "synchronize", lambda device=None: None)
    calls = []
    pipeline = EmbeddingPipeline(_Model(calls, launch_seconds=0.02), torch.device("cpu"), batch_size=4)
    pipeline.image_graphs = _Graphs(calls)
    warm_up.eager_batch_deciding_graphs(pipeline, torch.zeros(4, 1), full_batches_left)
    return calls, pipeline


def test_a_run_with_few_batches_left_does_not_capture(monkeypatch):
    calls, pipeline = _probe_on_cpu(monkeypatch, warm_up.GRAPH_MIN_BATCHES_LEFT - 1)
    assert calls == [("eager", 4), ("released",)] and pipeline.image_graphs is None
    assert pipeline.image_graphs_decided


def test_a_long_run_or_one_of_unknown_length_keeps_the_graph(monkeypatch):
    for left in (warm_up.GRAPH_MIN_BATCHES_LEFT, None):
        calls, pipeline = _probe_on_cpu(monkeypatch, left)
        assert calls == [("eager", 4)] and pipeline.image_graphs is not None
