"""A patched model gives the same bits call after call on the GPU: the rows a job writes, or a server answers,
do not depend on when they were computed. ViT-L-14's pooled last block took torch's own SDPA pick for its one
query a row, cuDNN on an H200, whose single-query kernel does not repeat its bits."""
from __future__ import annotations

import pytest
import torch

import clip_flash
from clip_flash.backends.sdpa import single_query_attention


@pytest.mark.parametrize("rows", [1, 64])
def test_single_query_attention_repeats_its_bits(rows):
    generator = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(rows, 16, 1, 64, device="cuda", dtype=torch.float16, generator=generator)
    kv = torch.randn(rows, 257, 2 * 16 * 64, device="cuda", dtype=torch.float16, generator=generator)
    k, v = kv.unflatten(-1, (2, 16, 64)).transpose(1, 3).unbind(2)  # the pooled block's views
    first = single_query_attention(q, k, v)
    reference = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / 8.0, dim=-1) @ v.float()
    assert (first.float() - reference).abs().max() < 2e-3
    for _ in range(10):
        assert torch.equal(single_query_attention(q, k, v), first)


@pytest.mark.parametrize("model_name, rows", [("ViT-L-14", 64), ("ViT-B-32", 256)])
def test_patched_image_tower_repeats_its_bits(build_model, model_name, rows):
    model = build_model(model_name, "fp16", "cuda")
    generator = torch.Generator(device="cuda").manual_seed(1)
    images = torch.randn(rows, 3, 224, 224, device="cuda", generator=generator).half()
    with clip_flash.patched(model), torch.inference_mode():
        first = model.encode_image(images)
        for _ in range(5):
            assert torch.equal(model.encode_image(images), first)
