"""The extension's one-call replay (``replay_graph``) against torch's replay steps: the same rows bit for bit, the
same stream order, and torch's replay kept for graphs that draw random numbers."""
from __future__ import annotations

import open_clip
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clip_flash.graphs import GraphedEncoder, capture
from clip_flash.graphs.capture import CaptureSpace, GraphKey
from clip_flash.ops._extension import load_extension

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

KEY = GraphKey("image", 8, (3, 16, 16), torch.half)


@pytest.fixture(scope="module")
def extension():
    module = load_extension()
    if module is None or not hasattr(module, "replay_graph"):
        pytest.skip("the extension is not built with replay_graph here")
    return module


def small_tower() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.GELU(), nn.Linear(64, 32)).cuda().half().eval()


def images(batch: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed)).half()


def captured_tower(function=None):
    """(space, graph, tower): the caller keeps ``tower`` alive while it replays, since the graph reads its weights
    where they were at capture (as the encoder keeps its model)."""
    space = CaptureSpace(torch.device("cuda", torch.cuda.current_device()), torch.cuda.Stream())
    tower = function or small_tower()
    with torch.inference_mode():
        graph = space.capture(KEY, tower, warmup_iters=2)
    assert not isinstance(graph, str), graph
    return space, graph, tower


def test_one_call_rows_equal_torchs_replay_bit_for_bit(extension):
    space, graph, tower = captured_tower()
    with torch.inference_mode():
        first = space.replay(graph, images(8, 0).cuda(), 8, False)
        torch.testing.assert_close(first, tower(images(8, 0).cuda()), rtol=1e-2, atol=1e-3)
        assert graph.one_call is True and graph.graph_exec != 0
        assert torch.equal(first, space.replay(graph, images(8, 0).cuda(), 8, False))
        for n, rows, normalize in [(8, None, False), (3, None, True), (1, None, False), (5, 2, True), (8, 8, True)]:
            for place in ("device", "page-locked", "pageable"):
                x = images(n, n)
                x = x.cuda() if place == "device" else x.pin_memory() if place == "page-locked" else x
                one_call = space.replay(graph, x, n, normalize, out_rows=rows)
                graph.one_call = False
                steps = space.replay(graph, x, n, normalize, out_rows=rows)
                graph.one_call = True
                assert one_call.shape == steps.shape == (n if rows is None else rows, 32)
                assert one_call.dtype == steps.dtype == torch.half
                assert torch.equal(one_call, steps), (n, rows, normalize, place)


def test_a_graph_that_draws_random_numbers_keeps_torchs_replay(extension):
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :32] + torch.rand(x.shape[0], 32, device=x.device, dtype=x.dtype)

    space, graph, _ = captured_tower(noisy)
    with torch.inference_mode():
        x = images(8, 1).cuda()
        first = space.replay(graph, x, 8, False)
        assert graph.one_call is False and graph.graph_exec == 0
        second = space.replay(graph, x, 8, False)
    assert not torch.equal(first, second)  # torch's prologue gave the graph fresh numbers


def test_one_call_is_ordered_after_the_callers_stream_and_before_its_later_work(extension):
    space, graph, tower = captured_tower()
    with torch.inference_mode():
        expected = space.replay(graph, images(4, 2).cuda(), 4, True)
        torch.testing.assert_close(expected, F.normalize(tower(images(4, 2).cuda()), dim=-1), rtol=1e-2, atol=1e-3)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for _ in range(3):
                x = torch.zeros(4, 3, 16, 16, device="cuda", dtype=torch.half)
                torch.cuda._sleep(20_000_000)  # the caller's stream is busy well past the call's return
                x.copy_(images(4, 2).pin_memory(), non_blocking=True)
                out = space.replay(graph, x, 4, True)
                seen = out.clone()  # the caller's later work, on its own stream
                out.fill_(0)
        torch.cuda.synchronize()
    assert torch.equal(seen, expected)


def test_the_encoder_replays_in_one_call_after_its_first_replay(monkeypatch, extension):
    class Spy:
        calls = 0

        def __getattr__(self, name):
            return getattr(extension, name)

        def replay_graph(self, *arguments):
            Spy.calls += 1
            return extension.replay_graph(*arguments)

    spy = Spy()
    monkeypatch.setattr(capture, "load_extension", lambda: spy)
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=32, vision_cfg=dict(layers=2, width=64, head_width=32, patch_size=8, image_size=16),
        text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=2, layers=2)).cuda().half().eval()
    encoder = GraphedEncoder(model, batch_sizes=(4,))
    with torch.inference_mode():
        rows = [encoder.encode_image(images(3, 5).cuda(), normalize=True) for _ in range(3)]
    assert Spy.calls == 2  # the first replay went through torch and decided
    assert torch.equal(rows[0], rows[1]) and torch.equal(rows[1], rows[2])
    encoder.release()
