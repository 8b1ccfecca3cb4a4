"""Fused memory-bound ops of a transformer residual block, in the model's dtype with fp32 math.

- ``layer_norm``: what OpenCLIP's ``LayerNormFp32`` computes (cast to fp32, normalize, cast back), in one pass.
- ``add_layer_norm``: the residual update ``residual + scale * delta`` and the LayerNorm of its result, both
  written by one pass over each row.
- ``bias_act``: the activation after the MLP's first projection (whose bias cuBLAS adds, as in stock).
- ``residual_add``: the residual update alone (after the last block, where no LayerNorm follows).

Every op is a ``torch.library`` custom op (``clip_flash::<name>``), so ``torch.compile(fullgraph=True)``
traces it as one node. It runs the CUDA kernels of ``clip_flash._C`` for CUDA float16/bfloat16 tensors and
the same formula in plain PyTorch everywhere else (CPU, float32/float64, extension missing); on float32
that formula is OpenCLIP's own. Math is fp32 (or the input's precision when wider) and each output is
rounded once; optional per-column vectors (LayerNorm affine, LayerScale gamma) may be float32 or
the activations' dtype. Gradients are plain-torch formulas, recomputed in backward.

In plain eager inference (no tensor needs a gradient, nothing is compiling or tracing) the public functions
skip the custom-op dispatcher (per call, its Python work costs as much as a small kernel) and run the same
implementation directly.
"""
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._extension import extension_available, extension_unavailable_reason, load_extension

__all__ = ["ACTIVATIONS", "layer_norm", "add_layer_norm", "bias_act", "residual_add", "describe_backend"]

ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "identity")
QUICK_GELU_ALPHA = 1.702

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)
_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)


# ---------------------------------------------------------------------------------------------------------
# Plain-PyTorch formulas: the fallback path, the source of gradients, and the definition the kernels match.
# ---------------------------------------------------------------------------------------------------------


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit inputs; wider inputs keep their own precision."""
    return torch.float32 if dtype in _KERNEL_DTYPES else dtype


def _to(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    return None if t is None else t.to(dtype)


def _residual_update_reference(residual: Tensor, delta: Tensor, scale: Optional[Tensor]) -> Tensor:
    # OpenCLIP's order: x + ls(proj(h)), where proj (cuBLAS) added its bias and ls multiplies by gamma.
    math = _math_dtype(residual.dtype)
    update = delta.to(math)
    if scale is not None:
        update = update * scale.to(math)
    return (residual.to(math) + update).to(residual.dtype)


def _layer_norm_reference(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    math = _math_dtype(x.dtype)
    return F.layer_norm(x.to(math), x.shape[-1:], _to(weight, math), _to(bias, math), eps).to(x.dtype)


def _add_layer_norm_reference(
    residual: Tensor,
    delta: Tensor,
    scale: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor]:
    # The LayerNorm reads the updated residual as stored (rounded), like the next block does.
    updated = _residual_update_reference(residual, delta, scale)
    return updated, _layer_norm_reference(updated, weight, bias, eps)


def _activation_reference(x: Tensor, activation: str) -> Tensor:
    if activation == "gelu":
        return F.gelu(x)
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if activation == "quick_gelu":
        return x * torch.sigmoid(QUICK_GELU_ALPHA * x)  # open_clip's QuickGELU
    return x


def _bias_act_reference(x: Tensor, activation: str) -> Tensor:
    return _activation_reference(x.to(_math_dtype(x.dtype)), activation).to(x.dtype)


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")


def _check_same_shape(residual: Tensor, delta: Tensor) -> None:
    if residual.shape != delta.shape:
        raise ValueError(f"residual {tuple(residual.shape)} and delta {tuple(delta.shape)} differ in shape")


# ---------------------------------------------------------------------------------------------------------
# Implementations: the CUDA kernel when it applies, else the formula above.
# ---------------------------------------------------------------------------------------------------------


def _kernel_applies(matrices: Sequence[Tensor], vectors: Sequence[Optional[Tensor]]) -> bool:
    """CUDA float16/bfloat16 matrices of one dtype, vectors in float32 or that dtype, extension loaded."""
    first = matrices[0]
    if not first.is_cuda or first.dtype not in _KERNEL_DTYPES or first.numel() == 0:
        return False
    if any(m.dtype != first.dtype for m in matrices[1:]):
        return False
    if any(v is not None and v.dtype not in (torch.float32, first.dtype) for v in vectors):
        return False
    return extension_available()


def _as_vector(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _owned_contiguous(result: Tensor, *inputs: Tensor) -> Tensor:
    """``result`` as a contiguous tensor sharing no memory with ``inputs`` (what the fake kernels promise)."""
    if any(result is t for t in inputs):
        return result.clone(memory_format=torch.contiguous_format)
    return result.contiguous()


def _layer_norm_impl(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    if _kernel_applies([x], [weight, bias]):
        # The extension takes any rank as rows over the last dim and returns x's shape (cheaper than here).
        return load_extension().layer_norm(x, _as_vector(weight), _as_vector(bias), eps)
    return _owned_contiguous(_layer_norm_reference(x, weight, bias, eps), x)


def _add_layer_norm_impl(
    residual: Tensor,
    delta: Tensor,
    scale: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor]:
    _check_same_shape(residual, delta)
    if _kernel_applies([residual, delta], [scale, weight, bias]):
        return load_extension().add_layer_norm(
            residual, delta, _as_vector(scale), _as_vector(weight), _as_vector(bias), eps,
        )
    updated, normed = _add_layer_norm_reference(residual, delta, scale, weight, bias, eps)
    return _owned_contiguous(updated, residual, delta), _owned_contiguous(normed)


def _bias_act_impl(x: Tensor, activation: str, in_place: bool) -> Tensor:
    """``activation(x)``; with ``in_place`` (contiguous ``x``, kernel path only) written into ``x``."""
    _check_activation(activation)
    if _kernel_applies([x], []):
        in_place = in_place and x.is_contiguous()
        out = load_extension().bias_act(x, activation, in_place)
        if in_place:
            torch.autograd.graph.increment_version(x)  # the kernel wrote through a raw pointer
            return x
        return out
    return _owned_contiguous(_bias_act_reference(x, activation), x)


def _residual_add_impl(residual: Tensor, delta: Tensor, scale: Optional[Tensor]) -> Tensor:
    _check_same_shape(residual, delta)
    if _kernel_applies([residual, delta], [scale]):
        return load_extension().residual_add(residual, delta, _as_vector(scale))
    return _owned_contiguous(_residual_update_reference(residual, delta, scale), residual, delta)


# ---------------------------------------------------------------------------------------------------------
# Custom ops: what torch.compile and autograd see.
# ---------------------------------------------------------------------------------------------------------


def _empty_like(t: Tensor) -> Tensor:
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.custom_op("clip_flash::layer_norm", mutates_args=())
def _layer_norm_op(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    return _layer_norm_impl(x, weight, bias, eps)


@_layer_norm_op.register_fake
def _layer_norm_fake(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    return _empty_like(x)


@torch.library.custom_op("clip_flash::add_layer_norm", mutates_args=())
def _add_layer_norm_op(
    residual: Tensor,
    delta: Tensor,
    scale: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor]:
    return _add_layer_norm_impl(residual, delta, scale, weight, bias, eps)


@_add_layer_norm_op.register_fake
def _add_layer_norm_fake(
    residual: Tensor,
    delta: Tensor,
    scale: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor]:
    _check_same_shape(residual, delta)
    return _empty_like(residual), _empty_like(residual)


@torch.library.custom_op("clip_flash::bias_act", mutates_args=())
def _bias_act_op(x: Tensor, activation: str) -> Tensor:
    return _bias_act_impl(x, activation, in_place=False)


@_bias_act_op.register_fake
def _bias_act_fake(x: Tensor, activation: str) -> Tensor:
    _check_activation(activation)
    return _empty_like(x)


@torch.library.custom_op("clip_flash::residual_add", mutates_args=())
def _residual_add_op(residual: Tensor, delta: Tensor, scale: Optional[Tensor]) -> Tensor:
    return _residual_add_impl(residual, delta, scale)


@_residual_add_op.register_fake
def _residual_add_fake(residual: Tensor, delta: Tensor, scale: Optional[Tensor]) -> Tensor:
    _check_same_shape(residual, delta)
    return _empty_like(residual)


def _register_recomputed_backward(op, reference: Callable, tensor_arg_count: int) -> None:
    """Give ``op`` a backward that differentiates ``reference`` (its plain-torch formula) at the saved inputs.

    The op's first ``tensor_arg_count`` arguments are (optional) tensors; the rest are constants.
    """

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:tensor_arg_count])
        ctx.constants = inputs[tensor_arg_count:]

    def backward(ctx, *grad_outputs):
        needs_grad = ctx.needs_input_grad[:tensor_arg_count]
        with torch.enable_grad():
            leaves = [
                None if t is None else t.detach().requires_grad_(need)
                for t, need in zip(ctx.saved_tensors, needs_grad)
            ]
            outputs = reference(*leaves, *ctx.constants)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            used = [(out, grad) for out, grad in zip(outputs, grad_outputs) if grad is not None and out.requires_grad]
            wanted = [leaf for leaf in leaves if leaf is not None and leaf.requires_grad]
            grads = [None] * len(wanted)
            if used and wanted:
                grads = torch.autograd.grad(
                    [out for out, _ in used], wanted, [grad for _, grad in used], allow_unused=True
                )
        remaining = iter(grads)
        tensor_grads = [next(remaining) if leaf is not None and leaf.requires_grad else None for leaf in leaves]
        return (*tensor_grads, *([None] * len(ctx.constants)))

    op.register_autograd(backward, setup_context=setup_context)


_register_recomputed_backward(_layer_norm_op, _layer_norm_reference, tensor_arg_count=3)
_register_recomputed_backward(_add_layer_norm_op, _add_layer_norm_reference, tensor_arg_count=5)
_register_recomputed_backward(_bias_act_op, _bias_act_reference, tensor_arg_count=1)
_register_recomputed_backward(_residual_add_op, _residual_update_reference, tensor_arg_count=3)


# ---------------------------------------------------------------------------------------------------------
# Public API.
# ---------------------------------------------------------------------------------------------------------


def call_directly(*tensors: Optional[Tensor]) -> bool:
    """Whether plain eager inference lets a call skip the custom-op dispatcher (same result, less overhead).

    Not while compiling or tracing, under a dispatch mode (FakeTensorMode, make_fx, ...), for tensor
    subclasses, or when autograd must record the op.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _get_current_dispatch_mode() is not None:
        return False
    grad_enabled = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN_TENSOR_TYPES or (grad_enabled and t.requires_grad):
            return False
    return True


def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    """LayerNorm over the last dim with fp32 statistics and affine; the result is a new tensor in ``x.dtype``.

    Numerically OpenCLIP's ``LayerNormFp32`` (``F.layer_norm(x.float(), ...).to(x.dtype)``) in one pass.
    ``weight``/``bias`` have shape ``(C,)`` and may be float32 or ``x.dtype``.
    """
    if call_directly(x, weight, bias):
        return _layer_norm_impl(x, weight, bias, float(eps))
    return _layer_norm_op(x, weight, bias, float(eps))


def add_layer_norm(
    residual: Tensor,
    delta: Tensor,
    scale: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor]:
    """``(new_residual, LayerNorm(new_residual))`` with ``new_residual = residual + scale * delta``.

    ``delta`` is the preceding projection's output (its bias added by the GEMM); ``scale`` (LayerScale gamma)
    is optional, shape ``(C,)``. Both outputs are new tensors in ``residual.dtype``, each rounded once from fp32
    math; the LayerNorm (fp32 statistics) is taken over ``new_residual`` as stored, i.e. as the next block reads it.
    """
    if call_directly(residual, delta, scale, weight, bias):
        return _add_layer_norm_impl(residual, delta, scale, weight, bias, float(eps))
    return _add_layer_norm_op(residual, delta, scale, weight, bias, float(eps))


def bias_act(x: Tensor, activation: str) -> Tensor:
    """``activation(x)`` with fp32 math and one rounding, in ``x.dtype`` (``x``: c_fc's output, bias included).

    ``activation`` is one of ``ACTIVATIONS``: "gelu" (erf, ``nn.GELU()``), "gelu_tanh"
    (``nn.GELU(approximate='tanh')``), "quick_gelu" (``x * sigmoid(1.702 x)``), "identity".

    ``x`` is donated: pass a tensor you own (a fresh GEMM output) and use only the return value. In eager
    inference on the CUDA kernel path a contiguous ``x`` is overwritten with the result and returned;
    elsewhere (autograd, torch.compile, CPU) ``x`` is left unchanged and a new tensor is returned.
    """
    _check_activation(activation)
    if call_directly(x):
        return _bias_act_impl(x, activation, in_place=True)
    return _bias_act_op(x, activation)


def residual_add(residual: Tensor, delta: Tensor, scale: Optional[Tensor]) -> Tensor:
    """``residual + scale * delta`` with fp32 math and one rounding; a new tensor."""
    if call_directly(residual, delta, scale):
        return _residual_add_impl(residual, delta, scale)
    return _residual_add_op(residual, delta, scale)


def describe_backend() -> str:
    """Which implementation the fp16/bf16 CUDA path uses here, for reports and result files."""
    if not torch.cuda.is_available():
        return "plain PyTorch (no CUDA device)"
    reason = extension_unavailable_reason()
    return "CUDA kernels (clip_flash._C)" if reason is None else f"plain PyTorch ({reason})"
