"""The packed attention op off the GPU: its formula, its fake kernel, and when the kernel would not take a call."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from clip_flash.ops.packed_attention import kernel_takes, packed_attention, packed_attention_reference


def test_the_formula_is_attention_within_each_sequence():
    torch.manual_seed(0)
    lengths = [3, 0, 5, 1]
    q, k, v = (torch.randn(9, 2, 64, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    for causal in (True, False):
        out = packed_attention(q, k, v, cu, 5, causal)
        start = 0
        for length in lengths:
            rows = slice(start, start + length)
            scores = torch.einsum("qhd,khd->hqk", q[rows], k[rows]) / 8.0
            if causal:
                scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
            expected = torch.einsum("hqk,khd->qhd", F.softmax(scores, dim=-1), v[rows])
            torch.testing.assert_close(out[rows], expected)
            start += length


def test_fp16_runs_in_fp32_and_rounds_once():
    torch.manual_seed(0)
    q, k, v = (torch.randn(6, 1, 64, dtype=torch.float16) for _ in range(3))
    cu = torch.tensor([0, 6], dtype=torch.int32)
    out = packed_attention(q, k, v, cu, 6, True)
    assert out.dtype == torch.float16
    expected = packed_attention_reference(q.float(), k.float(), v.float(), cu, True).half()
    assert torch.equal(out, expected)


def test_the_kernel_takes_no_cpu_call_and_the_fake_kernel_gives_the_shape():
    q = torch.randn(9, 2, 64, dtype=torch.float16)
    assert not kernel_takes(q, q, q, 5)
    with FakeTensorMode():
        fake = torch.empty(9, 2, 64, dtype=torch.float16)
        out = torch.ops.clip_flash.packed_attention(fake, fake, fake, torch.empty(3, dtype=torch.int32), 5, True, 0.125)
        assert out.shape == (9, 2, 64) and out.dtype == torch.float16


def test_gradients_flow_through_the_formula():
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 1, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda q, k, v: packed_attention(q, k, v, cu, 3, True), (q, k, v))
