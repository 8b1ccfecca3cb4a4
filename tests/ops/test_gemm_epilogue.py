"""c_fc's bias + activation in a Triton GEMM epilogue (clip_flash.ops.experimental.gemm_epilogue).

On CPU: the dispatcher falls back to the unfused path exactly. On the GPU (skipped without CUDA): the kernel's
error against an fp32 reference is at most about twice the unfused path's, on even and ragged shapes and every
activation, and a patched model running it stays within the accuracy rule."""
from __future__ import annotations

import open_clip
import pytest
import torch
import torch.nn.functional as F
from tests.utils import image_size

import clip_flash
from clip_flash.ops import fused_ops
from clip_flash.ops.experimental import gemm_epilogue
from clip_flash.patching.residual_block import FlashResidualAttentionBlock

ACTIVATIONS = ["gelu", "gelu_tanh", "quick_gelu", "identity"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _operands(rows, n, k, dtype, device, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(device, dtype)
    weight = (torch.randn(n, k, generator=g) * k ** -0.5).to(device, dtype)
    b = (torch.randn(n, generator=g) * 0.1).to(device, dtype) if bias else None
    return x, weight, b


def _reference(x, weight, bias, activation):
    """The activation of the fp32 GEMM, in fp32: what both paths approximate."""
    return fused_ops._activation_reference(F.linear(x.float(), weight.float(), None if bias is None else
                                                    bias.float()), activation)


def test_cpu_falls_back_to_the_unfused_path_exactly():
    x, weight, bias = _operands(5000, 64, 32, torch.float32, "cpu")
    assert gemm_epilogue.unavailable_reason(x, weight) is not None
    expected = fused_ops.bias_act(F.linear(x, weight, bias), "gelu")
    assert torch.equal(gemm_epilogue.linear_act(x, weight, bias, "gelu"), expected)
    assert not gemm_epilogue.calibrated_choices()  # nothing calibrated off the GPU


def test_patch_option_reaches_every_fused_block(build_model):
    model = build_model("ViT-B-32")
    with clip_flash.patched(model):  # off by default: it lost to cuBLAS on the H100
        assert not any(m._clip_flash_plan.gemm_epilogue for m in model.modules()
                       if isinstance(m, FlashResidualAttentionBlock))
    for enabled in (True, False):
        with clip_flash.patched(model, gemm_epilogue=enabled):
            plans = [m._clip_flash_plan for m in model.modules() if isinstance(m, FlashResidualAttentionBlock)]
            assert plans and all(p.gemm_epilogue is enabled for p in plans if p.fused)
        assert clip_flash.patch_report(model) is None
    with clip_flash.patched(model, fuse_blocks=False):  # no fused blocks: no epilogue either
        assert not any(m._clip_flash_plan.gemm_epilogue for m in model.modules()
                       if isinstance(m, FlashResidualAttentionBlock))


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True], ids=["pointer", "tma"])
@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(4100, 3072, 768), (333, 200, 104), (8192, 4096, 1024), (1000, 5120, 1280)])
def test_kernel_error_at_most_twice_the_unfused_path(shape, activation, precision, tma):
    rows, n, k = shape
    x, weight, bias = _operands(rows, n, k, DTYPES[precision], "cuda", bias=activation != "identity")
    reason = (gemm_epilogue.tma_unavailable_reason if tma else gemm_epilogue.unavailable_reason)(x, weight)
    if reason:
        pytest.skip(reason)
    fused = gemm_epilogue.triton_linear_act(x, weight, bias, activation, tma=tma)
    unfused = gemm_epilogue.cublas_linear_act(x, weight, bias, activation)
    reference = _reference(x, weight, bias, activation)
    assert fused.shape == unfused.shape and fused.dtype == x.dtype
    fused_error = (fused.float() - reference).abs().max().item()
    unfused_error = (unfused.float() - reference).abs().max().item()
    assert fused_error <= 2 * unfused_error + 1e-6, (fused_error, unfused_error)


@pytest.mark.gpu
def test_three_dimensional_and_strided_inputs():
    x, weight, bias = _operands(6 * 700, 256, 128, torch.float16, "cuda")
    x3 = x.view(6, 700, 128)
    fused = gemm_epilogue.triton_linear_act(x3, weight, bias, "gelu")
    assert fused.shape == (6, 700, 256)
    wide = torch.randn(6 * 700, 256, device="cuda", dtype=torch.float16)
    wide[:, :128] = x
    strided = wide[:, :128]  # rows with a stride past their length, as a slice of a wider buffer
    torch.testing.assert_close(gemm_epilogue.triton_linear_act(strided, weight, bias, "gelu"),
                               fused.view(-1, 256), rtol=0, atol=0)
    if gemm_epilogue.tma_unavailable_reason(x, weight) is None:
        tma = gemm_epilogue.triton_tma_linear_act(x3, weight, bias, "gelu")
        torch.testing.assert_close(gemm_epilogue.triton_tma_linear_act(strided, weight, bias, "gelu"),
                                   tma.view(-1, 256), rtol=0, atol=0)
        torch.testing.assert_close(tma, fused, rtol=0, atol=2e-3)  # same math, another summation order


@pytest.mark.gpu
def test_dispatch_calibrates_once_per_shape_and_matches(monkeypatch):
    monkeypatch.setattr(gemm_epilogue, "_choices", {})
    x, weight, bias = _operands(gemm_epilogue.MIN_ROWS + 100, 1024, 256, torch.float16, "cuda")
    first = gemm_epilogue.linear_act(x, weight, bias, "gelu")
    choices = gemm_epilogue.calibrated_choices()
    assert len(choices) == 1 and list(choices.values())[0] in (
        "triton_epilogue", "triton_tma_epilogue", "cublas+bias_act")
    second = gemm_epilogue.linear_act(x[:-50], weight, bias, "gelu")  # same rows bucket: no new calibration
    assert len(gemm_epilogue.calibrated_choices()) == 1
    torch.testing.assert_close(second, first[:-50], rtol=0, atol=0)
    small = x[:100]
    assert torch.equal(gemm_epilogue.linear_act(small, weight, bias, "gelu"),
                       gemm_epilogue.cublas_linear_act(small, weight, bias, "gelu"))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["triton_linear_act", "triton_tma_linear_act"])
@pytest.mark.parametrize("precision", list(DTYPES))
def test_patched_model_on_the_epilogue_kernel_keeps_the_accuracy_rule(monkeypatch, precision, kernel):
    probe = torch.empty(8, 64, device="cuda", dtype=torch.float16)
    if kernel == "triton_tma_linear_act" and gemm_epilogue.tma_unavailable_reason(probe, probe):
        pytest.skip(gemm_epilogue.tma_unavailable_reason(probe, probe))
    # Force the kernel wherever the dispatcher would calibrate, so this test covers it whatever wins here.
    monkeypatch.setattr(gemm_epilogue, "_choices", {})
    monkeypatch.setattr(gemm_epilogue, "_calibrate", lambda *args: getattr(gemm_epilogue, kernel))
    torch.manual_seed(0)
    reference = open_clip.create_model("ViT-B-32", pretrained=None, device="cuda").eval()
    model = open_clip.create_model("ViT-B-32", pretrained=None, precision=precision, device="cuda").eval()
    model.load_state_dict(reference.state_dict())
    size = image_size(reference)
    images = torch.randn(96, 3, size, size, generator=torch.Generator().manual_seed(1)).cuda()  # 4800 rows
    with torch.inference_mode():
        expected = reference.encode_image(images).float()
        stock = model.encode_image(images.to(DTYPES[precision])).float()
        with clip_flash.patched(model, gemm_epilogue=True):
            patched = model.encode_image(images.to(DTYPES[precision])).float()
    assert gemm_epilogue.calibrated_choices(), "the epilogue kernel never ran"

    def error(out):
        return (out - expected).abs().max().item() / expected.abs().max().item()

    assert error(patched) <= 2 * error(stock), (error(patched), error(stock))
    assert (1 - F.cosine_similarity(patched, expected)).max().item() <= \
        2 * (1 - F.cosine_similarity(stock, expected)).max().item() + 1e-6
