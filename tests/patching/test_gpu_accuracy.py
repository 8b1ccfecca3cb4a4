"""GPU accuracy (skipped without CUDA): in fp16 and bf16, the patched model's error against an fp32 reference of
the same weights is at most about twice the stock model's error in the same dtype, for every backend that runs.

Run on the GPU machine with ``-s`` to print one line per case (committed under results/)."""
from __future__ import annotations

import functools

import open_clip
import pytest
import torch
import torch.nn.functional as F
from tests.utils import assert_within_twice_stock, edge_case_tokens, image_size

import clip_flash

pytestmark = pytest.mark.gpu

MODELS = ["ViT-B-32", "ViT-L-14"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BACKENDS = ["auto", "sdpa", "sdpa:cudnn", "sdpa:flash", "sdpa:efficient", "flash_attn"]
CAPTIONS = [f"a photo of a {c}." for c in ("cat", "small red car parked by the sea", "dog", "tench", "goldfish",
                                          "great white shark", "tiger shark swimming in very deep blue water")]


@functools.lru_cache(maxsize=None)
def _models(name: str, precision: str):
    """(fp32 reference, stock model in ``precision``) with identical weights."""
    torch.manual_seed(0)
    reference = open_clip.create_model(name, pretrained=None, device="cuda").eval()
    low = open_clip.create_model(name, pretrained=None, precision=precision, device="cuda").eval()
    low.load_state_dict(reference.state_dict())
    return reference, low


@functools.lru_cache(maxsize=None)
def _inputs(name: str):
    tokenizer = open_clip.get_tokenizer(name)
    captions = tokenizer(CAPTIONS * 37)  # 259 rows: varied lengths, so the packed path runs
    tokens = torch.cat([captions, edge_case_tokens()]).cuda()
    size = image_size(_models(name, "fp16")[0])
    images = torch.randn(16, 3, size, size, generator=torch.Generator().manual_seed(0)).cuda()
    return tokens, images


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("name", MODELS)
def test_error_against_fp32_at_most_twice_stock(name, precision, backend):
    if backend != "auto" and not clip_flash.available_backends()[backend].available:
        pytest.skip(f"{backend}: {clip_flash.available_backends()[backend].reason}")
    reference, model = _models(name, precision)
    tokens, images = _inputs(name)
    dtype = DTYPES[precision]
    with torch.inference_mode():
        ref_text, ref_image = reference.encode_text(tokens), reference.encode_image(images)
        stock_text, stock_image = model.encode_text(tokens), model.encode_image(images.to(dtype))
        with clip_flash.patched(model, backend) as report:
            text, image = model.encode_text(tokens), model.encode_image(images.to(dtype))
    assert text.dtype == dtype and image.dtype == dtype  # precision unchanged
    for tower, out, stock, ref in (("text", text, stock_text, ref_text), ("image", image, stock_image, ref_image)):
        assert_within_twice_stock(out, stock, ref, f"{name} {precision} backend={backend} "
                                  f"ran={report.backends_used()} {tower}", log=True)


@pytest.mark.parametrize("precision", list(DTYPES))
def test_text_paths_packed_and_cut_agree_with_stock(precision):
    """Packed (varied lengths) and cut (uniform lengths) batches both follow the error rule."""
    reference, model = _models("ViT-B-32", precision)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    uniform = tokenizer(["a photo of a cat."] * 64).cuda()
    varied, _ = _inputs("ViT-B-32")
    with torch.inference_mode():
        for tokens in (uniform, varied, varied[:1], varied[:7]):
            ref = reference.encode_text(tokens)
            stock = model.encode_text(tokens)
            with clip_flash.patched(model):
                out = model.encode_text(tokens)
            assert_within_twice_stock(out, stock, ref, f"tokens {tuple(tokens.shape)}", check_cosine=False)


def test_unpatch_is_bit_identical_on_gpu():
    _, model = _models("ViT-B-32", "fp16")
    tokens, images = _inputs("ViT-B-32")
    with torch.inference_mode():
        stock = model.encode_text(tokens), model.encode_image(images.half())
        with clip_flash.patched(model):
            model.encode_text(tokens), model.encode_image(images.half())
        again = model.encode_text(tokens), model.encode_image(images.half())
    assert torch.equal(stock[0], again[0]) and torch.equal(stock[1], again[1])


def test_autocast_is_respected():
    reference, _ = _models("ViT-B-32", "fp16")
    tokens, images = _inputs("ViT-B-32")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        stock = reference.encode_text(tokens), reference.encode_image(images)
        with clip_flash.patched(reference):
            patched_out = reference.encode_text(tokens), reference.encode_image(images)
    for s, p in zip(stock, patched_out):
        assert p.dtype == s.dtype
        assert (1 - F.cosine_similarity(p.float(), s.float(), dim=-1)).max().item() < 1e-3
