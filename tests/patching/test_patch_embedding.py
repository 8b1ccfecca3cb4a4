"""The patch embedding as a GEMM, and the one-pass standalone norms: same results as stock, clean fallbacks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from open_clip.transformer import LayerNorm, LayerNormFp32

import clip_flash
from clip_flash.patching import patch_embedding as patch_embedding_module
from clip_flash.patching.layer_norms import OnePassLayerNormFp32, fused_norm_class
from clip_flash.patching.patch_embedding import PatchEmbeddingConv2d, patch_embedding, patch_embedding_blockers



@pytest.mark.parametrize("height, width, patch, with_bias", [
    (224, 224, 14, False),  # ViT-L-14: 588-long patches
    (224, 224, 32, True),
    (230, 227, 16, True),   # rows and columns past the last whole patch are ignored, as by the conv
    (16, 48, 16, False),    # a single row of patches
])
def test_gemm_equals_conv_in_float64(height, width, patch, with_bias):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, height, width, dtype=torch.float64, generator=generator)
    weight = torch.randn(24, 3, patch, patch, dtype=torch.float64, generator=generator)
    bias = torch.randn(24, dtype=torch.float64, generator=generator) if with_bias else None
    expected = F.conv2d(x, weight, bias, stride=patch)
    out = patch_embedding(x, weight, bias)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # The (B, gh * gw, E) view OpenCLIP takes next is contiguous: no transposing copy needed.
    assert out.reshape(3, 24, -1).permute(0, 2, 1).is_contiguous()


def test_padded_patches_give_the_same_values_and_gradients(monkeypatch):
    """The zero-padded path (taken on CUDA for 16-bit 14x14 patches) forced on CPU: same values and grads."""
    monkeypatch.setattr(patch_embedding_module, "_padded_length", lambda length, patches, x: length + 5)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 28, 42, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(8, 3, 14, 14, dtype=torch.float64, generator=generator, requires_grad=True)
    out = patch_embedding(x, weight)
    expected = F.conv2d(x, weight, stride=14)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), (x, weight))
    expected_grads = torch.autograd.grad(expected.square().sum(), (x, weight))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("conv, blocker", [
    (torch.nn.Conv2d(3, 8, 14, stride=7), "stride"),
    (torch.nn.Conv2d(3, 8, 14, stride=14, padding=1), "padding"),
    (torch.nn.Conv2d(3, 8, 14, stride=14, dilation=2), "dilation"),
    (torch.nn.Conv2d(3, 6, 14, stride=14, groups=3), "groups"),
])
def test_convs_that_are_not_patch_embeddings_are_named(conv, blocker):
    assert any(blocker in reason for reason in patch_embedding_blockers(conv))


def test_a_plain_patch_conv_has_no_blockers():
    assert patch_embedding_blockers(torch.nn.Conv2d(3, 8, 14, stride=14, bias=False)) == []


def test_patch_swaps_conv1_and_the_standalone_norms(build_model):
    model = build_model("ViT-B-32")
    norms = (model.visual.ln_pre, model.visual.ln_post, model.ln_final)
    stock_classes = [type(norm) for norm in norms]
    one_pass_classes = [fused_norm_class(norm) for norm in norms]
    assert None not in one_pass_classes
    with clip_flash.patched(model) as report:
        assert type(model.visual.conv1) is PatchEmbeddingConv2d
        assert [type(norm) for norm in norms] == one_pass_classes
        assert "patch embedding as one GEMM" in report.towers["vision"]
        assert "ln_pre/ln_post in one pass" in report.towers["vision"]
        assert "ln_final in one pass" in report.towers["text"]
    assert type(model.visual.conv1) is torch.nn.Conv2d
    assert [type(norm) for norm in norms] == stock_classes


def test_options_keep_the_stock_front(build_model):
    model = build_model("ViT-B-32")
    norm_class = type(model.visual.ln_pre)
    with clip_flash.patched(model, patch_embedding_gemm=False, fuse_blocks=False) as report:
        assert type(model.visual.conv1) is torch.nn.Conv2d
        assert type(model.visual.ln_pre) is norm_class
        assert "patch embedding" not in report.towers.get("vision", "")


def test_stock_conv_that_is_not_a_patch_embedding_stays_and_is_reported(build_model):
    model = build_model("ViT-B-32")
    original = model.visual.conv1
    odd = torch.nn.Conv2d(3, original.out_channels, 32, stride=32, padding=0, dilation=1, bias=False)
    odd.stride = (16, 16)  # overlapping patches: not a plain patch embedding
    model.visual.conv1 = odd
    try:
        with clip_flash.patched(model) as report:
            assert type(model.visual.conv1) is torch.nn.Conv2d
            assert "patch embedding stock (stride" in report.towers["vision"]
    finally:
        model.visual.conv1 = original


@pytest.mark.parametrize("stock_class", [LayerNorm, LayerNormFp32, torch.nn.LayerNorm])
def test_one_pass_norm_matches_stock(stock_class):
    norm = stock_class(16)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(4, 5, 16)
    expected = norm(x)
    norm.__class__ = fused_norm_class(norm)
    torch.testing.assert_close(norm(x), expected, rtol=1e-6, atol=1e-6)


def test_one_pass_fp32_norm_keeps_stocks_error_for_half_weights():
    norm = LayerNormFp32(16).half()
    norm.__class__ = OnePassLayerNormFp32
    with pytest.raises(RuntimeError):
        norm(torch.randn(2, 16).half())


def test_norms_without_affine_or_over_several_dims_are_not_swapped():
    assert fused_norm_class(torch.nn.LayerNorm(16, elementwise_affine=False)) is None
    assert fused_norm_class(torch.nn.LayerNorm((4, 16))) is None
    assert fused_norm_class(torch.nn.GroupNorm(2, 16)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("patch, width", [(14, 1024), (32, 768)])
@pytest.mark.parametrize("pad", [None, True, False])
def test_gemm_error_within_twice_cudnn_conv_error_cuda(dtype, batch, patch, width, pad):
    torch.manual_seed(0)
    images = torch.randn(batch, 3, 224, 224, device="cuda")
    weight = torch.randn(width, 3, patch, patch, device="cuda") * (3 * patch * patch) ** -0.5
    with torch.backends.cudnn.flags(allow_tf32=False):  # a true fp32 reference
        reference = F.conv2d(images, weight, stride=patch)
    stock = F.conv2d(images.to(dtype), weight.to(dtype), stride=patch).float()
    ours = patch_embedding(images.to(dtype), weight.to(dtype), pad=pad)
    assert ours.dtype == dtype and ours.shape == stock.shape
    for error in (lambda t: (t - reference).abs().max(), lambda t: (t - reference).abs().mean()):
        assert error(ours.float()) <= 2 * error(stock), (error(ours.float()).item(), error(stock).item())
