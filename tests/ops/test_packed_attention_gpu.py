"""clip_flash's packed short-sequence attention kernel against the fp32 formula, beside torch's varlen_attn."""
from __future__ import annotations

import pytest
import torch

from clip_flash.ops.packed_attention import kernel_takes, packed_attention, packed_attention_reference

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

# Every tile edge case: empty, one token, exactly one tile, one past it, CLIP's 77, the kernel's longest.
LENGTHS = [1, 5, 16, 17, 0, 25, 77, 33, 128, 2, 64]


def packed(lengths, heads=12, dtype=torch.float16, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    qkv = torch.randn(total, 3, heads, 64, device="cuda", dtype=dtype, generator=generator)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = qkv.unbind(1)  # strided views, as the block's projection gives them
    return q, k, v, cu


def varlen(q, k, v, cu, longest, causal):
    from torch.nn.attention.varlen import varlen_attn
    return varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0) if causal else (-1, -1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_within_twice_flash_error_of_the_fp32_formula(dtype, causal):
    q, k, v, cu = packed(LENGTHS, dtype=dtype)
    assert kernel_takes(q, k, v, 128)
    out = packed_attention(q, k, v, cu, 128, causal)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    reference = packed_attention_reference(q.float(), k.float(), v.float(), cu, causal)
    error = (out.float() - reference).abs().max().item()
    flash_error = (varlen(q, k, v, cu, 128, causal).float() - reference).abs().max().item()
    assert error <= 2 * flash_error + 1e-6, (error, flash_error)
    assert torch.isfinite(out).all()


def test_a_smaller_max_seqlen_and_other_heads_give_the_same_rows():
    lengths = [3, 40, 77, 9]
    q, k, v, cu = packed(lengths, heads=8)
    reference = packed_attention_reference(q.float(), k.float(), v.float(), cu, True)
    for max_seqlen in (77, 80, 128):
        out = packed_attention(q, k, v, cu, max_seqlen, True)
        assert (out.float() - reference).abs().max().item() < 2e-3


def test_an_understated_max_seqlen_marks_only_that_sequence():
    lengths = [10, 40, 12]
    q, k, v, cu = packed(lengths)
    out = packed_attention(q, k, v, cu, 32, True)  # the 40-token sequence does not fit 32
    torch.cuda.synchronize()
    assert torch.isnan(out[10:50]).all()
    assert torch.isfinite(out[:10]).all() and torch.isfinite(out[50:]).all()
    expected = packed_attention_reference(q.float(), k.float(), v.float(), cu, True)
    assert (out[:10].float() - expected[:10]).abs().max().item() < 2e-3


def test_calls_it_does_not_take_run_the_formula():
    q, k, v, cu = packed([5, 9])
    assert not kernel_takes(q, k, v, 129)
    assert not kernel_takes(q.float(), k.float(), v.float(), 9)
    narrow = torch.randn(14, 3, 12, 32, device="cuda", dtype=torch.float16).unbind(1)
    assert not kernel_takes(*narrow, 9)
    out = packed_attention(*narrow, cu, 9, True)
    expected = packed_attention_reference(*(t.float() for t in narrow), cu, True)
    assert (out.float() - expected).abs().max().item() < 2e-3


def test_replays_in_a_cuda_graph():
    q, k, v, cu = packed([7, 30, 77])
    static_out = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        packed_attention(q, k, v, cu, 77, True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out.append(packed_attention(q, k, v, cu, 77, True))
    q.normal_()  # new inputs in the captured buffers
    graph.replay()
    torch.cuda.synchronize()
    expected = packed_attention_reference(q.float(), k.float(), v.float(), cu, True)
    assert (static_out[0].float() - expected).abs().max().item() < 2e-3


def test_a_call_that_wants_gradients_runs_the_differentiable_formula():
    q, k, v = (t.detach().requires_grad_() for t in packed([5, 9])[:3])
    cu = packed([5, 9])[3]
    assert not kernel_takes(q, k, v, 9)
    out = packed_attention(q, k, v, cu, 9, True)
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    with torch.no_grad():
        assert kernel_takes(q, k, v, 9)
