"""Tests of clip_flash.ops.fused_ops.

CPU: the plain-PyTorch path against the obvious torch formulas (and stock OpenCLIP modules), gradients,
torch.compile tracing, odd shapes and layouts. GPU (skipped without CUDA or without clip_flash._C): the CUDA
kernels in float16 and bfloat16, whose max error against the same formula in fp32 (from the same rounded
inputs) must stay within twice the stock torch sequence's error in that dtype, plus 1e-3 * max|reference|.
"""
import logging
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from clip_flash.ops import _extension
from clip_flash.ops.fused_ops import ACTIVATIONS, add_layer_norm, bias_act, describe_backend, layer_norm, residual_add

EPS = 1e-5
# The kernel tests need the compiled extension too; without it the ops fall back to plain PyTorch.
_needs_extension = pytest.mark.skipif(not _extension.extension_available(),
                                     reason="needs the compiled clip_flash._C extension")


def requires_kernels(test):
    """A GPU test (the ``gpu`` marker) that also needs the compiled extension."""
    return pytest.mark.gpu(_needs_extension(test))


def _maybe(t: Tensor, present: bool) -> Optional[Tensor]:
    return t if present else None


# ----------------------------------------------------------------------------------------------------------
# The obvious torch formulas (fp32 math, one rounding), written independently of clip_flash.ops.fused_ops.
# ----------------------------------------------------------------------------------------------------------


def expected_layer_norm(x, weight, bias, eps=EPS):
    w = None if weight is None else weight.double()
    b = None if bias is None else bias.double()
    return F.layer_norm(x.double(), x.shape[-1:], w, b, eps).to(x.dtype)


def expected_residual_update(residual, delta, scale):
    update = delta.double()
    update = update * (1 if scale is None else scale.double())
    return (residual.double() + update).to(residual.dtype)


def expected_activation(x: Tensor, activation: str) -> Tensor:
    return {
        "gelu": lambda v: 0.5 * v * (1 + torch.erf(v / 2**0.5)),
        "gelu_tanh": lambda v: 0.5 * v * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (v + 0.044715 * v**3))),
        "quick_gelu": lambda v: v / (1 + torch.exp(-1.702 * v)),
        "identity": lambda v: v,
    }[activation](x)


def expected_bias_act(x, activation):
    return expected_activation(x.double(), activation).to(x.dtype)


def assert_close_to_rounding(actual: Tensor, expected: Tensor) -> None:
    """Equal up to the last bit of the dtype (fp32 rounding order, or one 16-bit rounding step)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tolerance = {torch.float32: 2e-6, torch.float64: 1e-12, torch.float16: 1e-3, torch.bfloat16: 8e-3}
    rtol = tolerance[actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol)


# ----------------------------------------------------------------------------------------------------------
# CPU: values
# ----------------------------------------------------------------------------------------------------------

CPU_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ODD_SHAPES = [(2, 3, 8), (2, 5, 50), (257 * 3, 13), (5, 1), (1, 7), (7,)]  # (B, L, C), odd C, ...


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_cpu(dtype, shape, affine):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 2 + 3).to(dtype)
    weight = _maybe(torch.randn(shape[-1]), affine)  # float32, as LayerNormFp32 keeps it
    bias = _maybe(torch.randn(shape[-1]), affine)
    out = layer_norm(x, weight, bias, EPS)
    assert out.is_contiguous()
    assert_close_to_rounding(out, expected_layer_norm(x, weight, bias))


def test_layer_norm_weight_in_activation_dtype_cpu():
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    weight, bias = torch.randn(16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    assert_close_to_rounding(layer_norm(x, weight, bias, 1e-6), expected_layer_norm(x, weight, bias, 1e-6))


def test_layer_norm_is_open_clip_layer_norm_fp32():
    transformer = pytest.importorskip("open_clip.transformer")
    torch.manual_seed(0)
    module = transformer.LayerNormFp32(24, eps=1e-6)
    torch.nn.init.normal_(module.weight)
    torch.nn.init.normal_(module.bias)
    x = torch.randn(3, 5, 24)
    with torch.no_grad():
        torch.testing.assert_close(layer_norm(x, module.weight, module.bias, module.eps), module(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("scale_present, affine", [(True, True), (False, False), (False, True), (True, False)])
def test_add_layer_norm_cpu(dtype, shape, scale_present, affine):
    torch.manual_seed(0)
    cols = shape[-1]
    residual, delta = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    scale = _maybe(torch.rand(cols) + 0.5, scale_present)  # float32, as LayerScale keeps it
    weight, bias = _maybe(torch.randn(cols), affine), _maybe(torch.randn(cols), affine)
    updated, normed = add_layer_norm(residual, delta, scale, weight, bias, EPS)
    expected_updated = expected_residual_update(residual, delta, scale)
    assert_close_to_rounding(updated, expected_updated)
    # The LayerNorm is of the residual as stored.
    assert_close_to_rounding(normed, expected_layer_norm(updated, weight, bias))
    assert updated.is_contiguous() and normed.is_contiguous()


def test_add_layer_norm_matches_open_clip_block_sequence_fp32():
    """Stock: ``x = q_x + ls_1(attn_out)`` then ``ln_2(x)``; delta is the projection's output, its bias included."""
    torch.manual_seed(0)
    q_x, attn_out_no_bias, out_bias = torch.randn(2, 9, 32), torch.randn(2, 9, 32), torch.randn(32)
    gamma, ln = torch.rand(32), torch.nn.LayerNorm(32)
    torch.nn.init.normal_(ln.weight)
    with torch.no_grad():
        stock_x = q_x + (attn_out_no_bias + out_bias) * gamma
        stock_normed = ln(stock_x)
        updated, normed = add_layer_norm(q_x, attn_out_no_bias + out_bias, gamma, ln.weight, ln.bias, ln.eps)
    torch.testing.assert_close(updated, stock_x, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(normed, stock_normed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("scale_present", [True, False])
def test_residual_add_cpu(dtype, shape, scale_present):
    torch.manual_seed(0)
    cols = shape[-1]
    residual, delta = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    scale = _maybe(torch.rand(cols).to(dtype), scale_present)
    out = residual_add(residual, delta, scale)
    assert_close_to_rounding(out, expected_residual_update(residual, delta, scale))


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bias_act_cpu(dtype, activation):
    torch.manual_seed(0)
    x = (torch.randn(257 * 3, 24) * 3).to(dtype)
    x_before = x.clone()
    out = bias_act(x, activation)
    assert_close_to_rounding(out, expected_bias_act(x_before, activation))
    assert out.data_ptr() != x.data_ptr(), "the CPU path returns a new tensor"
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)


def test_bias_act_matches_stock_modules_fp32():
    transformer = pytest.importorskip("open_clip.transformer")
    torch.manual_seed(0)
    x, bias = torch.randn(6, 40) * 4, torch.randn(40)
    stock = {
        "gelu": torch.nn.GELU(),
        "gelu_tanh": torch.nn.GELU(approximate="tanh"),
        "quick_gelu": transformer.QuickGELU(),
        "identity": torch.nn.Identity(),
    }
    for activation, module in stock.items():
        torch.testing.assert_close(bias_act((x + bias).clone(), activation), module(x + bias), rtol=1e-6, atol=1e-6)


def test_non_contiguous_inputs_cpu():
    torch.manual_seed(0)
    strided_rows = torch.randn(6, 20)[:, 3:11]  # last dim contiguous, row stride 20
    transposed = torch.randn(8, 6).t()  # last dim not contiguous
    weight, bias = torch.randn(8), torch.randn(8)
    for x in (strided_rows, transposed):
        w, b = weight, bias
        out = layer_norm(x, w, b, EPS)
        assert out.is_contiguous()
        assert_close_to_rounding(out, expected_layer_norm(x, w, b))
        delta = torch.randn(x.shape).t().contiguous().t()  # another layout again
        updated, normed = add_layer_norm(x, delta, w, w, b, EPS)
        assert_close_to_rounding(updated, expected_residual_update(x, delta, w))
        assert_close_to_rounding(normed, expected_layer_norm(updated, w, b))
        assert_close_to_rounding(residual_add(x, delta, w), expected_residual_update(x, delta, w))
        assert_close_to_rounding(bias_act(x, "gelu"), expected_bias_act(x, "gelu"))


def test_fp64_keeps_fp64_math():
    x = torch.randn(3, 10, dtype=torch.float64)
    out = layer_norm(x, None, None, EPS)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.layer_norm(x, (10,), eps=EPS), rtol=1e-12, atol=1e-12)


def test_empty_rows_cpu():
    x = torch.empty(0, 16, dtype=torch.float16)
    assert layer_norm(x, None, None, EPS).shape == (0, 16)
    assert add_layer_norm(x, x, None, None, None, EPS)[1].shape == (0, 16)
    assert bias_act(x, "gelu").shape == (0, 16)
    assert residual_add(x, x, None).shape == (0, 16)


def test_invalid_arguments_raise():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="activation"):
        bias_act(x, "relu")
    with pytest.raises(ValueError, match="shape"):
        residual_add(x, torch.randn(2, 5), None)
    with pytest.raises(ValueError, match="shape"):
        add_layer_norm(x, torch.randn(3, 4), None, None, None, EPS)


# ----------------------------------------------------------------------------------------------------------
# CPU: gradients, torch.compile, fake tensors, extension loader
# ----------------------------------------------------------------------------------------------------------


def _double_leaf(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


# fast_mode (random projections of the Jacobian) keeps these quick; each LayerNorm call is the slow part.
def test_gradcheck_layer_norm():
    x, w, b = _double_leaf(3, 6), _double_leaf(6), _double_leaf(6)
    assert torch.autograd.gradcheck(lambda *a: layer_norm(*a, EPS), (x, w, b), fast_mode=True)
    assert torch.autograd.gradcheck(lambda x: layer_norm(x, None, None, EPS), (x,), fast_mode=True)


def test_gradcheck_add_layer_norm():
    r, d, s, w, b = _double_leaf(2, 3, 5), _double_leaf(2, 3, 5), *[_double_leaf(5) for _ in range(3)]
    assert torch.autograd.gradcheck(lambda *a: add_layer_norm(*a, EPS), (r, d, s, w, b), fast_mode=True)
    # Only one output used, optional inputs absent, a constant (no-grad) residual.
    constant_r = r.detach()
    assert torch.autograd.gradcheck(
        lambda d, w: add_layer_norm(constant_r, d, None, w, None, EPS)[1], (d, w), fast_mode=True
    )


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradcheck_bias_act(activation):
    x = _double_leaf(4, 5)
    assert torch.autograd.gradcheck(lambda x: bias_act(x, activation), (x,))


def test_gradcheck_residual_add():
    r, d, s = _double_leaf(3, 4), _double_leaf(3, 4), _double_leaf(4)
    assert torch.autograd.gradcheck(residual_add, (r, d, s))
    assert torch.autograd.gradcheck(lambda r, d: residual_add(r, d, None), (r, d))


def _block_like(residual, delta, out_bias, gamma, ln_w, ln_b, fc_bias, next_w, next_b):
    """A residual-block-shaped chain of all four ops: ln_2 and the next block's ln_1 have their own weights,
    as in a model (a LayerNorm's weights are never shared between two norms there)."""
    # The projections' biases are added by their GEMMs (here by plain adds), as in the patched block.
    updated, normed = add_layer_norm(residual, delta + out_bias, gamma, ln_w, ln_b, EPS)
    hidden = bias_act(normed * 2 + fc_bias, "gelu")  # `* 2 + fc_bias` stands in for the MLP's first GEMM
    return residual_add(updated, hidden + out_bias, gamma), layer_norm(updated, next_w, next_b, EPS)


def _plain_block_like(residual, delta, out_bias, gamma, ln_w, ln_b, fc_bias, next_w, next_b):
    updated = residual + gamma * (delta + out_bias)
    normed = F.layer_norm(updated, updated.shape[-1:], ln_w, ln_b, EPS)
    hidden = F.gelu(normed * 2 + fc_bias)
    return updated + gamma * (hidden + out_bias), F.layer_norm(updated, updated.shape[-1:], next_w, next_b, EPS)


def _block_inputs(rows, cols, device="cpu", dtype=torch.float32, requires_grad=False):
    torch.manual_seed(0)
    tensors = [torch.randn(rows, cols), torch.randn(rows, cols)] + [torch.randn(cols) for _ in range(7)]
    return [t.to(device=device, dtype=dtype).requires_grad_(requires_grad) for t in tensors]


def test_gradients_match_plain_torch_sequence():
    inputs = _block_inputs(6, 10, requires_grad=True)
    outputs = _block_like(*inputs)
    grads = torch.autograd.grad(sum(o.square().sum() for o in outputs), inputs)
    plain_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    plain_outputs = _plain_block_like(*plain_inputs)
    plain_grads = torch.autograd.grad(sum(o.square().sum() for o in plain_outputs), plain_inputs)
    for ours, plain in zip(outputs + grads, plain_outputs + plain_grads):
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)


def test_torch_compile_fullgraph_traces_all_ops():
    """All four ops trace into one graph (aot_eager on CPU); gradients are covered by the tests above."""
    torch._dynamo.reset()
    compiled = torch.compile(_block_like, fullgraph=True, backend="aot_eager")
    inputs = _block_inputs(5, 12)
    for ours, ref in zip(compiled(*inputs), _block_like(*inputs)):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_ops_registered_and_fake_tensors_propagate():
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name in ("layer_norm", "add_layer_norm", "bias_act", "residual_add"):
        assert hasattr(torch.ops.clip_flash, name)
    with FakeTensorMode():
        x = torch.empty(4, 3, 16, dtype=torch.float16).transpose(0, 1)
        assert layer_norm(x, torch.empty(16), None, EPS).shape == (3, 4, 16)
        updated, normed = add_layer_norm(x, x, None, None, None, EPS)
        assert updated.shape == normed.shape == (3, 4, 16) and normed.is_contiguous()
        assert updated.dtype == normed.dtype == torch.float16
        assert bias_act(x, "quick_gelu").shape == (3, 4, 16)
        assert residual_add(x, x, None).dtype == torch.float16


def _opcheck_samples():
    """fp32 samples needing gradients, and bf16 ones (the kernels' dtype on GPU) that do not."""
    torch.manual_seed(0)
    m = lambda *shape: torch.randn(*shape, requires_grad=True)  # noqa: E731
    v = lambda: torch.randn(8, requires_grad=True)  # noqa: E731
    b = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16)  # noqa: E731
    return [
        (torch.ops.clip_flash.layer_norm, (m(3, 8), v(), v(), EPS)),
        (torch.ops.clip_flash.layer_norm, (b(2, 3, 8), None, None, EPS)),
        (torch.ops.clip_flash.add_layer_norm, (m(3, 8), m(3, 8), v(), v(), v(), EPS)),
        (torch.ops.clip_flash.add_layer_norm, (b(3, 8), b(3, 8), torch.randn(8), None, None, EPS)),
        (torch.ops.clip_flash.bias_act, (m(3, 8), "gelu")),
        (torch.ops.clip_flash.bias_act, (b(3, 8), "identity")),
        (torch.ops.clip_flash.residual_add, (m(3, 8), m(3, 8), v())),
        (torch.ops.clip_flash.residual_add, (b(3, 8), b(3, 8), None)),
    ]


def test_opcheck():
    """torch's own consistency check of schema, fake kernel, autograd registration and aliasing."""
    for op, args in _opcheck_samples():
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_extension_reason_logged_once(caplog):
    _extension._state.cache_clear()
    with caplog.at_level(logging.INFO, logger="clip_flash.ops._extension"):
        available = _extension.extension_available()
        _extension.extension_available()
        reason = _extension.extension_unavailable_reason()
    records = [r for r in caplog.records if r.name == "clip_flash.ops._extension"]
    if available:
        assert reason is None and not records
    else:
        assert isinstance(reason, str) and "clip_flash._C" in reason
        assert len(records) == 1 and records[0].getMessage() == reason


# ----------------------------------------------------------------------------------------------------------
# GPU: CUDA kernels against an fp32 reference, judged by the stock torch sequence's error in the same dtype
# ----------------------------------------------------------------------------------------------------------

GPU_DTYPES = [torch.float16, torch.bfloat16]
HIDDEN_SIZES = [512, 768, 1024, 1280, 1408, 1664]
MLP_WIDTHS = [2048, 3072, 4096, 5120, 6144, 8192]
ROWS = 257 * 3
RELATIVE_FLOOR = 1e-3  # of max|reference|: room for 16-bit rounding ties going the other way


def assert_error_within_stock(ours: Tensor, stock: Tensor, reference: Tensor, what: str = "") -> None:
    """max|ours - ref| <= 2 * max|stock - ref| + 1e-3 * max|ref|, ``ref`` the fp32 formula on the same inputs."""
    assert ours.dtype == stock.dtype and ours.shape == stock.shape == reference.shape, what
    assert reference.dtype == torch.float32, what
    assert torch.isfinite(ours).all(), what
    our_error = (ours.float() - reference).abs().max().item()
    stock_error = (stock.float() - reference).abs().max().item()
    floor = RELATIVE_FLOOR * reference.abs().max().item()
    assert our_error <= 2 * stock_error + floor, f"{what}: max error ours {our_error:.3g}, stock {stock_error:.3g}"


def assert_kernels_in_use() -> None:
    assert describe_backend().startswith("CUDA kernels"), describe_backend()


def _cuda(*shape, dtype, mean=0.0, std=1.0):
    return (torch.randn(*shape, device="cuda") * std + mean).to(dtype)


# The stock torch sequences, op by op in the activations' dtype (what OpenCLIP runs without clip_flash).
def stock_layer_norm(x, weight, bias):
    """LayerNormFp32 semantics: normalize and apply the affine in fp32, round once to x.dtype."""
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return F.layer_norm(x.float(), x.shape[-1:], w, b, EPS).to(x.dtype)


def stock_residual_update(residual, delta, scale):
    """``x + ls(proj(h))`` (``delta``: the projection's output): LayerScale, then the residual add, each rounded."""
    return residual + (delta if scale is None else delta * scale.to(residual.dtype))


def stock_activation(x, activation):
    return {"gelu": torch.nn.GELU(), "gelu_tanh": torch.nn.GELU(approximate="tanh"),
            "quick_gelu": lambda v: v * torch.sigmoid(1.702 * v), "identity": lambda v: v}[activation](x)


# The same formulas in fp32 from the same (16-bit) inputs: the references.
def fp32_layer_norm(x, weight, bias):
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return F.layer_norm(x.float(), x.shape[-1:], w, b, EPS)


def fp32_residual_update(residual, delta, scale):
    return residual.float() + delta.float() * (1 if scale is None else scale.float())


def fp32_add_layer_norm(residual, delta, scale, weight, bias):
    """kernel_args.h: the LayerNorm is of the updated residual as stored (rounded to the matrix dtype)."""
    updated = fp32_residual_update(residual, delta, scale)
    return updated, fp32_layer_norm(updated.to(residual.dtype), weight, bias)


def fp32_bias_act(x, activation):
    return expected_activation(x.float(), activation)


def check_add_layer_norm(residual, delta, scale, weight, bias, what=""):
    updated, normed = add_layer_norm(residual, delta, scale, weight, bias, EPS)
    reference_updated, reference_normed = fp32_add_layer_norm(residual, delta, scale, weight, bias)
    stock_updated = stock_residual_update(residual, delta, scale)
    assert_error_within_stock(updated, stock_updated, reference_updated, f"{what} updated")
    assert_error_within_stock(normed, stock_layer_norm(stock_updated, weight, bias), reference_normed, f"{what} normed")


def check_layer_norm(x, weight, bias, what=""):
    assert_error_within_stock(layer_norm(x, weight, bias, EPS), stock_layer_norm(x, weight, bias),
                              fp32_layer_norm(x, weight, bias), f"{what} layer_norm")


def check_residual_add(residual, delta, scale, what=""):
    assert_error_within_stock(residual_add(residual, delta, scale),
                              stock_residual_update(residual, delta, scale),
                              fp32_residual_update(residual, delta, scale), f"{what} residual_add")


def check_bias_act(x, activation, what=""):
    stock = stock_activation(x, activation)
    reference = fp32_bias_act(x, activation)
    assert_error_within_stock(bias_act(x.clone(), activation), stock, reference, f"{what} bias_act {activation}")


@requires_kernels
def test_describe_backend_reports_kernels_cuda():
    assert_kernels_in_use()


@requires_kernels
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("cols", HIDDEN_SIZES + [4096, 8192])
@pytest.mark.parametrize("affine_dtype", ["float32", "same", None])
@torch.inference_mode()
def test_layer_norm_cuda(dtype, cols, affine_dtype):
    assert_kernels_in_use()
    torch.manual_seed(cols)
    x = _cuda(ROWS, cols, dtype=dtype, mean=2.0, std=3.0)
    vector_dtype = torch.float32 if affine_dtype == "float32" else dtype
    weight = None if affine_dtype is None else _cuda(cols, dtype=vector_dtype, mean=1.0, std=0.2)
    bias = None if affine_dtype is None else _cuda(cols, dtype=vector_dtype, std=0.2)
    check_layer_norm(x, weight, bias)
    check_layer_norm(x.view(3, 257, cols), weight, bias, "3-D")


@requires_kernels
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("cols", HIDDEN_SIZES)
@pytest.mark.parametrize("vector_dtype", ["float32", "same"])
@pytest.mark.parametrize("scale_present", [True, False])
@torch.inference_mode()
def test_add_layer_norm_cuda(dtype, cols, vector_dtype, scale_present):
    assert_kernels_in_use()
    torch.manual_seed(cols)
    vectors = torch.float32 if vector_dtype == "float32" else dtype
    residual = _cuda(ROWS, cols, dtype=dtype, std=4.0)
    delta = _cuda(ROWS, cols, dtype=dtype)
    scale = _maybe(_cuda(cols, dtype=vectors, mean=0.5, std=0.1), scale_present)
    weight, bias = _cuda(cols, dtype=vectors, mean=1.0, std=0.2), _cuda(cols, dtype=vectors, std=0.2)
    check_add_layer_norm(residual, delta, scale, weight, bias)
    check_add_layer_norm(residual.view(3, 257, cols), delta.view(3, 257, cols), scale, None, None, "3-D")


@requires_kernels
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("cols", HIDDEN_SIZES)
@pytest.mark.parametrize("vector_dtype", ["float32", "same"])
@torch.inference_mode()
def test_residual_add_cuda(dtype, cols, vector_dtype):
    assert_kernels_in_use()
    torch.manual_seed(cols)
    vectors = torch.float32 if vector_dtype == "float32" else dtype
    residual, delta = _cuda(ROWS, cols, dtype=dtype, std=4.0), _cuda(ROWS, cols, dtype=dtype)
    scale = _cuda(cols, dtype=vectors, mean=0.5, std=0.1)
    for s in (scale, None):
        check_residual_add(residual, delta, s)


@requires_kernels
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("cols", MLP_WIDTHS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@torch.inference_mode()
def test_bias_act_cuda(dtype, cols, activation):
    assert_kernels_in_use()
    torch.manual_seed(cols)
    x = _cuda(ROWS, cols, dtype=dtype, std=3.0)
    check_bias_act(x, activation)
    check_bias_act(x.view(3, 257, cols), activation, "3-D")


def _layouts(rows, cols, dtype):
    """Inputs that take the packed kernels with a row stride, and the scalar kernels (odd C, misaligned)."""
    return {
        "contiguous": _cuda(rows, cols, dtype=dtype),
        "row_stride": _cuda(rows, cols + 16, dtype=dtype)[:, :cols],  # column slice: rows not contiguous
        "misaligned": _cuda(rows, cols + 1, dtype=dtype)[:, 1:],  # column slice starting off a 16-byte boundary
        "odd_cols": _cuda(rows, cols - 3, dtype=dtype),
        "three_d": _cuda(3, rows, cols, dtype=dtype).transpose(0, 1),
    }


@requires_kernels
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("cols", [100, 768, 12288])  # 100: not a multiple of 8; 12288 > 8192: LN's scalar kernel
@torch.inference_mode()
def test_layouts_and_scalar_paths_cuda(dtype, cols):
    assert_kernels_in_use()
    torch.manual_seed(0)
    for name, x in _layouts(ROWS, cols, dtype).items():
        c = x.shape[-1]
        what = f"{name} C={c}"
        for vectors in (torch.float32, dtype):
            weight, bias = _cuda(c, dtype=vectors, mean=1.0, std=0.2), _cuda(c, dtype=vectors, std=0.2)
            delta = _cuda(*x.shape, dtype=dtype)
            check_layer_norm(x, weight, bias, what)
            check_add_layer_norm(x, delta, weight, weight, bias, what)
            check_add_layer_norm(x, delta, None, None, None, what)
            check_residual_add(x, delta, weight, what)
            check_residual_add(x, delta, None, what)
        for activation in ACTIVATIONS:
            check_bias_act(x, activation, what)


@requires_kernels
@pytest.mark.parametrize("rows, cols", [(1, 1024), (77, 768), (257, 1024), (800, 1024), (1000, 1536),
                                        (20000, 1024), (20000, 8192)])
@torch.inference_mode()
def test_layer_norm_rows_spread_over_threads_cuda(rows, cols):
    """The packed LayerNorm spreads few rows over more threads: on a 132-multiprocessor H100 these shapes run
    with 1, 1, 1, 2, 3, 4 and 4 packs per thread (other GPUs split them differently; each shape is checked)."""
    assert_kernels_in_use()
    torch.manual_seed(rows + cols)
    for dtype, vectors in [(torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)]:
        residual = _cuda(rows, cols, dtype=dtype, mean=1.0, std=4.0)
        delta = _cuda(rows, cols, dtype=dtype)
        scale = _cuda(cols, dtype=vectors, mean=0.5, std=0.1)
        weight, bias = _cuda(cols, dtype=vectors, mean=1.0, std=0.2), _cuda(cols, dtype=vectors, std=0.2)
        what = f"{rows}x{cols} {dtype}"
        check_add_layer_norm(residual, delta, scale, weight, bias, what)
        check_add_layer_norm(residual, delta, None, None, None, what)
        check_layer_norm(residual, weight, bias, what)


@requires_kernels
@torch.inference_mode()
def test_many_rows_loop_over_grid_cuda():
    """More rows than one grid covers (grid.y is capped at 65535), single-row and single-column inputs."""
    assert_kernels_in_use()
    for rows, cols in [(2_100_007, 8), (1, 1664), (1000, 1)]:
        x = _cuda(rows, cols, dtype=torch.float16)
        delta = _cuda(rows, cols, dtype=torch.float16)
        what = f"{rows}x{cols}"
        check_residual_add(x, delta, None, what)
        check_bias_act(x, "quick_gelu", what)
        check_layer_norm(x, None, None, what)


@requires_kernels
def test_bias_act_writes_in_place_only_in_eager_inference_cuda():
    x = _cuda(8, 64, dtype=torch.float16)
    with torch.inference_mode():
        expected = stock_activation(x, "gelu")
        donated = x.clone()
        out = bias_act(donated, "gelu")
    assert out.data_ptr() == donated.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)
    leaf = x.clone().requires_grad_()
    out = bias_act(leaf, "gelu")
    assert out.data_ptr() != leaf.data_ptr()
    torch.testing.assert_close(leaf.detach(), x, rtol=0, atol=0)


@requires_kernels
def test_autograd_through_custom_op_cuda():
    """fp16 inputs needing gradients go through the custom ops (kernel forward, recomputed backward)."""
    assert_kernels_in_use()
    torch.manual_seed(0)
    cols = 768
    x = _cuda(ROWS, cols, dtype=torch.float16, std=2.0).requires_grad_()
    delta = _cuda(ROWS, cols, dtype=torch.float16)
    gamma = _cuda(cols, dtype=torch.float32, mean=0.5, std=0.1)
    ln_w = _cuda(cols, dtype=torch.float32, mean=1.0, std=0.2).requires_grad_()
    ln_b = _cuda(cols, dtype=torch.float32, std=0.2).requires_grad_()

    updated, normed = add_layer_norm(x, delta, gamma, ln_w, ln_b, EPS)
    hidden = bias_act(normed, "quick_gelu")
    final = layer_norm(x, ln_w, ln_b, EPS)
    final2 = residual_add(x, delta, gamma)
    for out, op in [(normed, "add_layer_norm"), (hidden, "bias_act"), (final, "layer_norm"), (final2, "residual_add")]:
        assert f"clip_flash_{op}" in out.grad_fn.name(), out.grad_fn.name()
        assert out.dtype == torch.float16
    # The forward is the kernel's: bit-identical to the eager inference call.
    with torch.inference_mode():
        eager_updated, eager_normed = add_layer_norm(x.detach(), delta, gamma, ln_w.detach(), ln_b.detach(), EPS)
        eager_hidden = bias_act(eager_normed.clone(), "quick_gelu")
    torch.testing.assert_close(updated.detach(), eager_updated, rtol=0, atol=0)
    torch.testing.assert_close(normed.detach(), eager_normed, rtol=0, atol=0)
    torch.testing.assert_close(hidden.detach(), eager_hidden, rtol=0, atol=0)

    weights = [torch.randn(ROWS, cols, device="cuda") for _ in range(4)]

    def loss_of(outputs):
        return sum((o.float() * w).sum() for o, w in zip(outputs, weights))

    grads = torch.autograd.grad(loss_of([updated, hidden, final, final2]), [x, ln_w, ln_b])

    # The torch formula, recomputed in fp32 from the same inputs.
    x32, w32, b32 = (t.detach().float().requires_grad_() for t in (x, ln_w, ln_b))
    u32 = x32 + delta.float() * gamma
    n32 = F.layer_norm(u32, (cols,), w32, b32, EPS)
    h32 = expected_activation(n32, "quick_gelu")
    f32 = F.layer_norm(x32, (cols,), w32, b32, EPS)
    reference = torch.autograd.grad(loss_of([u32, h32, f32, u32]), [x32, w32, b32])
    for name, ours, ref in zip(["x", "ln_w", "ln_b"], grads, reference):
        assert ours.dtype == (torch.float16 if name == "x" else torch.float32)
        scale = ref.abs().max().item()
        torch.testing.assert_close(ours.float(), ref, rtol=2e-2, atol=1e-2 * scale, msg=lambda m: f"{name}: {m}")


def _add_ln_then_bias_act(residual, delta, out_bias, gamma, ln_w, ln_b, fc_bias, *unused_next_norm):
    updated, normed = add_layer_norm(residual, delta + out_bias, gamma, ln_w, ln_b, EPS)
    return updated, bias_act(normed * 2 + fc_bias, "gelu")  # `* 2 + fc_bias` stands in for the MLP's first GEMM


@requires_kernels
def test_torch_compile_aot_eager_cuda():
    assert_kernels_in_use()
    torch._dynamo.reset()
    inputs = _block_inputs(ROWS, 768, device="cuda", dtype=torch.float16)
    compiled = torch.compile(_add_ln_then_bias_act, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        eager = _add_ln_then_bias_act(*inputs)
        ours = compiled(*inputs)
    for o, e in zip(ours, eager):
        assert o.dtype == torch.float16
        torch.testing.assert_close(o, e, rtol=1e-3, atol=1e-3)


@requires_kernels
def test_cuda_graph_capture_uses_current_stream():
    """Launching on any stream but the capturing one would make capture fail."""
    static = _block_inputs(ROWS, 1024, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        eager = _block_like(*static)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _block_like(*static)  # warm-up on the side stream
            with torch.cuda.graph(graph, stream=stream):
                captured = _block_like(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
    for ours, ref in zip(captured, eager):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)


@requires_kernels
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_torch_compile_inductor_cuda(dtype):
    torch._dynamo.reset()
    inputs = _block_inputs(ROWS, 768, device="cuda", dtype=dtype)
    compiled = torch.compile(_block_like, fullgraph=True)
    with torch.inference_mode():
        for ours, ref in zip(compiled(*inputs), _block_like(*inputs)):
            torch.testing.assert_close(ours, ref, rtol=0, atol=0)


@requires_kernels
@pytest.mark.parametrize("loss_on", ["block_output", "next_norm", "both"])
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_training_gradients_cuda(dtype, loss_on):
    """Kernel forward, plain-torch backward: gradients as accurate as the stock sequence's.

    Judged for a loss on each output alone (so one path's error cannot hide behind another's) and on both.
    """
    inputs = _block_inputs(ROWS, 512, device="cuda", dtype=dtype, requires_grad=True)
    picked = {"block_output": [0], "next_norm": [1], "both": [0, 1]}[loss_on]

    def grads_of(block: Callable, tensors):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        outputs = block(*leaves)
        loss = sum(outputs[i].float().square().mean() for i in picked)
        return torch.autograd.grad(loss, leaves, allow_unused=True)  # next_norm alone leaves the MLP unused

    ours = grads_of(_block_like, inputs)
    stock = grads_of(_plain_block_like, inputs)
    reference = grads_of(_plain_block_like, [t.float() for t in inputs])
    failures = []
    names = ["residual", "delta", "out_bias", "gamma", "ln_w", "ln_b", "fc_bias", "next_w", "next_b"]
    for name, o, s, r in zip(names, ours, stock, reference):
        if r is None:
            continue
        o_err, s_err = (o.float() - r).norm().item(), (s.float() - r).norm().item()
        floor = (r.to(dtype).float() - r).norm().item()  # error of the exact gradient rounded once to dtype
        print(f"grad {dtype} loss_on={loss_on} {name}: ours {o_err:.3g} stock {s_err:.3g} "
              f"rounding floor {floor:.3g} |ref| {r.norm().item():.3g}")
        if not o_err <= 2 * s_err + 1e-4 * r.norm().item():
            failures.append(f"{name}: ours {o_err:.3g}, stock {s_err:.3g}")
    assert not failures, failures
