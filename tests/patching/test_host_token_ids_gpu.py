"""Patched text towers given token ids on the host (skipped without CUDA): the same features as from ids
already on the device, bit for bit, with no device sync for the lengths."""
from __future__ import annotations

import copy

import open_clip
import pytest
import torch
from tests.utils import edge_case_tokens

import clip_flash
from clip_flash.patching.text_fast_path import takes_host_token_ids

pytestmark = pytest.mark.gpu

CAPTIONS = ["a photo of a cat.", "a small red car parked by the sea, late in the afternoon", "dog", "",
            "tiger shark swimming in very deep blue water near a reef " * 3]


@pytest.fixture(scope="module")
def patched_model():
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", pretrained=None, precision="fp16", device="cuda").eval()
    stock = copy.deepcopy(model)
    clip_flash.patch(model)
    return stock, model


@pytest.mark.parametrize("pinned", [True, False])
def test_host_ids_give_the_device_ids_features(patched_model, pinned):
    stock, model = patched_model
    assert takes_host_token_ids(model) and not takes_host_token_ids(stock)
    tokens = torch.cat([open_clip.get_tokenizer("ViT-B-32")(CAPTIONS * 50), edge_case_tokens()])
    host = tokens.pin_memory() if pinned else tokens
    with torch.inference_mode():
        from_device = model.encode_text(tokens.cuda())
        from_host = model.encode_text(host)
        normalized = model.encode_text(host, normalize=True)
    assert from_host.is_cuda
    assert torch.equal(from_host, from_device)
    assert torch.equal(normalized, torch.nn.functional.normalize(from_device, dim=-1))


def test_host_ids_on_the_stock_fallback(patched_model):
    """Where the tower cannot skip padding (gradient checkpointing while grads are on), the stock path gets
    the ids moved to the device too, and computes what it computes from device ids."""
    _, model = patched_model
    tokens = open_clip.get_tokenizer("ViT-B-32")(CAPTIONS)
    model.transformer.grad_checkpointing = True
    try:
        with torch.enable_grad():
            from_host, from_device = model.encode_text(tokens), model.encode_text(tokens.cuda())
    finally:
        model.transformer.grad_checkpointing = False
    assert from_host.is_cuda and torch.equal(from_host.detach(), from_device.detach())


def test_host_ids_queue_without_waiting(patched_model):
    """Encoding host ids while the device is busy returns before the device work ends (no host sync)."""
    _, model = patched_model
    tokens = open_clip.get_tokenizer("ViT-B-32")(CAPTIONS * 200).pin_memory()
    busy = torch.empty(8192, 8192, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        model.encode_text(tokens)
        torch.cuda.synchronize()
        for _ in range(20):
            busy = busy @ busy  # tens of ms queued ahead
        done = torch.cuda.Event()
        model.encode_text(tokens)
        done.record()
        assert not done.query(), "encode_text waited for the queued device work"
        torch.cuda.synchronize()
