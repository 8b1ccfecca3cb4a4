"""CPU tests of the one-call replay's choice: which graphs the extension may replay, and the call it makes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from clip_flash.graphs import capture
from clip_flash.graphs.capture import CapturedGraph, CaptureSpace


class FakeGraph:
    def __init__(self, executable: int = 1234, fails: bool = False):
        self.executable, self.fails = executable, fails

    def raw_cuda_graph_exec(self) -> int:
        if self.fails:
            raise RuntimeError("You cannot access the raw cudaGraphExec_t instance until instantiate()")
        return self.executable


class RecordingExtension:
    def __init__(self):
        self.calls = []

    def replay_graph(self, *args):
        self.calls.append(args)
        return torch.ones(args[6], 4, device="meta")


def captured(graph=None) -> CapturedGraph:
    return CapturedGraph(graph or FakeGraph(), torch.empty(8, 3, device="meta"), torch.empty(8, 4, device="meta"),
                         0.0, 0, 0)


@pytest.fixture
def extension(monkeypatch):
    fake = RecordingExtension()
    monkeypatch.setattr(capture, "load_extension", lambda: fake)
    return fake


def test_a_graph_that_left_the_generator_alone_replays_in_one_call(extension):
    assert capture._one_call_for(captured(), 40, 40) == (True, 1234)


@pytest.mark.parametrize("before, after", [(40, 44), (None, None), (40, None)],
                         ids=["drew random numbers", "offset unreadable", "offset unreadable after"])
def test_a_graph_that_moved_the_generator_or_could_not_be_checked_keeps_torchs_replay(extension, before, after):
    assert capture._one_call_for(captured(), before, after) == (False, 0)


def test_without_the_extension_or_the_executable_torchs_replay_stays(monkeypatch, extension):
    assert capture._one_call_for(captured(FakeGraph(fails=True)), 40, 40) == (False, 0)
    monkeypatch.setattr(capture, "load_extension", lambda: SimpleNamespace())  # built without replay_graph
    assert capture._one_call_for(captured(), 40, 40) == (False, 0)
    monkeypatch.setattr(capture, "load_extension", lambda: None)
    assert capture._one_call_for(captured(), 40, 40) == (False, 0)


def test_a_decided_graph_goes_to_the_extension_with_its_executable_stream_and_rows(extension):
    space = CaptureSpace(torch.device("cuda", 0), SimpleNamespace(stream_id=777), pool=(0, 1))
    graph = captured()
    graph.one_call, graph.graph_exec = True, 1234
    x = torch.empty(3, 3, device="meta")
    out = space.replay(graph, x, 3, True, out_rows=5)
    assert out.shape == (5, 4)
    (call,) = extension.calls
    assert call[0] == 1234 and call[1] == 777 and call[2] is graph.static_input and call[3] is x
    assert call[4:] == (3, graph.static_output, 5, True)
