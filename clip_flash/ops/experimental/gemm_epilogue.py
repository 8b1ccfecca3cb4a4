"""c_fc with its bias and activation in the GEMM's epilogue: ``act(x @ W.T + b)`` in one Triton kernel.

The MLP's hidden activations are the widest tensor of a ViT block (4x the width). Stock OpenCLIP writes c_fc's
output, reads it back for the GELU and writes it again; cuBLAS can apply a GELU in its epilogue, but only the
tanh approximation, which is not what ``nn.GELU()`` computes. This kernel applies the model's exact activation
(erf GELU, tanh GELU or QuickGELU) to the accumulator before the only store.

Numerics match the unfused path (cuBLAS GEMM with bias, then ``fused_ops.bias_act``): fp32 accumulation, the
bias added in fp32, the sum rounded to the model's dtype (the stock GEMM's output), then the activation in fp32
with accurate libdevice ``erf``/``tanh``/``exp`` and one final rounding.

Two variants: plain pointer loads, and (sm90+) tiles loaded by the tensor memory accelerator. Whether either
runs is measured, not assumed: the first call for a (rows bucket, N, K, dtype, device) times both (Triton
autotunes each one's tile over a few configs) against cuBLAS + ``bias_act`` and keeps the fastest for that shape
for the process's lifetime (logged at INFO). Below ``MIN_ROWS`` rows, during CUDA-graph capture and when Triton
is missing, the cuBLAS path runs without calibrating. The kernels win nothing that matters at ViT MLP shapes
(``benchmarks/results/h100/gemm_epilogue_fp16.txt``), so patch() only routes here when asked.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import fused_ops
from ..cuda_timing import median_cuda_ms

logger = logging.getLogger(__name__)

# Below this many rows the GEMM is small and launch-bound: the second pass costs little and calibrating would
# cost more than it saves.
MIN_ROWS = 4096
_ACTIVATION_CODES = {"identity": 0, "gelu": 1, "gelu_tanh": 2, "quick_gelu": 3}
_DTYPES = (torch.float16, torch.bfloat16)

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
    try:  # Hopper's tensor-memory-accelerator loads (Triton >= 3.3)
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        TensorDescriptor = None
    _TRITON_ERROR: Optional[str] = None
except Exception as error:  # noqa: BLE001 - any import failure only disables this kernel
    triton = None
    _TRITON_ERROR = f"Triton is not importable ({type(error).__name__}: {error})"


if triton is not None:

    def _configs():
        # Tiles that keep Hopper's tensor cores busy on (tens of thousands of rows) x (3-6k) x (0.7-1.4k) GEMMs.
        shapes = [(128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4), (128, 256, 64, 4, 8),
                  (128, 128, 64, 3, 8)]
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
                for m, n, k, s, w in shapes]

    @triton.jit
    def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        # Grouped tile order: GROUP_M row tiles share each weight tile while it is in L2.
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n
        first_m = (pid // per_group) * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows

    @triton.autotune(configs=_configs(), key=["ROWS_BUCKET", "N", "K"])
    @triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
    @triton.jit
    def _linear_act_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, ROWS_BUCKET, stride_xm, stride_wn, stride_ym,
        ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):
        pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        # Out-of-range rows/columns read a valid row instead (wrapped); their results are never stored.
        rows = offs_m % M
        cols = offs_n % N
        x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = w_ptr + cols[None, :] * stride_wn + offs_k[:, None]  # a (BLOCK_K, BLOCK_N) tile of W.T

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(x_ptrs)
                b = tl.load(w_ptrs)
            else:
                left = K - k
                a = tl.load(x_ptrs, mask=offs_k[None, :] < left, other=0.0)
                b = tl.load(w_ptrs, mask=offs_k[:, None] < left, other=0.0)
            acc = tl.dot(a, b, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K

        if HAS_BIAS:
            acc += tl.load(b_ptr + cols).to(tl.float32)[None, :]
        v = _activate(acc, y_ptr.dtype.element_ty, ACTIVATION)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, v, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _activate(acc, out_dtype: tl.constexpr, ACTIVATION: tl.constexpr):
        # Round as the unfused GEMM stores its output, then activate in fp32 and round once more.
        v = acc.to(out_dtype).to(tl.float32)
        if ACTIVATION == 1:
            v = 0.5 * v * (1.0 + libdevice.erf(v * 0.7071067811865476))
        elif ACTIVATION == 2:
            v = 0.5 * v * (1.0 + libdevice.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
        elif ACTIVATION == 3:
            v = v / (1.0 + libdevice.exp(-1.702 * v))
        return v.to(out_dtype)

    def _set_tma_blocks(nargs):
        m, n, k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
        nargs["x_desc"].block_shape = [m, k]
        nargs["w_desc"].block_shape = [n, k]
        nargs["y_desc"].block_shape = [m, n]

    def _tma_configs():
        shapes = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4),
                  (128, 128, 128, 3, 8)]
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w,
                              pre_hook=_set_tma_blocks) for m, n, k, s, w in shapes]

    @triton.autotune(configs=_tma_configs(), key=["ROWS_BUCKET", "N", "K"])
    @triton.jit
    def _linear_act_tma_kernel(
        x_desc, w_desc, b_ptr, y_desc, M, N, K, ROWS_BUCKET,
        ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):
        # The same GEMM with TMA tile loads (bounds handled by the hardware: zero fill, clipped stores).
        pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = x_desc.load([off_m, k])
            b = w_desc.load([off_n, k])
            acc = tl.dot(a, b.T, acc)
        if HAS_BIAS:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        y_desc.store([off_m, off_n], _activate(acc, y_desc.dtype, ACTIVATION))


def _rows_bucket(rows: int) -> int:
    return 1 << max(rows - 1, 1).bit_length()


def unavailable_reason(x: Tensor, weight: Tensor) -> Optional[str]:
    """Why the fused kernel cannot take these operands (None: it can)."""
    if _TRITON_ERROR is not None:
        return _TRITON_ERROR
    if not x.is_cuda or x.dtype not in _DTYPES or weight.dtype != x.dtype:
        return "needs fp16/bf16 CUDA tensors of one dtype"
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return "needs compute capability >= 8.0"
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        return "needs unit-stride rows"
    return None


def tma_unavailable_reason(x: Tensor, weight: Tensor) -> Optional[str]:
    """Why the TMA variant cannot take these operands (None: it can)."""
    reason = unavailable_reason(x, weight)
    if reason is not None:
        return reason
    if TensorDescriptor is None:
        return "this Triton has no host tensor descriptors"
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return "TMA needs compute capability >= 9.0"
    if (x.shape[-1] * x.element_size()) % 16 or (weight.shape[0] * weight.element_size()) % 16:
        return "TMA needs rows of a multiple of 16 bytes"
    return None


def triton_linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str,
                      tma: bool = False) -> Tensor:
    """``activation(x @ weight.T + bias)`` in one Triton kernel; ``x`` is (..., K), ``weight`` (N, K).

    ``tma`` selects the variant whose tiles are loaded by Hopper's tensor memory accelerator.
    """
    reason = tma_unavailable_reason(x, weight) if tma else unavailable_reason(x, weight)
    if reason is not None:
        raise RuntimeError(f"triton_linear_act: {reason}")
    rows_in = x.reshape(-1, x.shape[-1])
    if rows_in.stride(-1) != 1:
        rows_in = rows_in.contiguous()
    m, k = rows_in.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*x.shape[:-1], n)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    with torch.cuda.device(x.device):
        if tma:
            # TMA wants 16-byte aligned bases and row strides; copy the rare operand that is not.
            if rows_in.data_ptr() % 16 or rows_in.stride(0) * rows_in.element_size() % 16:
                rows_in = rows_in.clone(memory_format=torch.contiguous_format)
            if weight.data_ptr() % 16 or weight.stride(0) * weight.element_size() % 16:
                weight = weight.clone(memory_format=torch.contiguous_format)
            # Block shapes are placeholders: the autotuner's pre-hook sets them per config.
            _linear_act_tma_kernel[grid](
                TensorDescriptor.from_tensor(rows_in, [64, 64]), TensorDescriptor.from_tensor(weight, [64, 64]),
                bias if bias is not None else weight, TensorDescriptor.from_tensor(out, [64, 64]),
                m, n, k, _rows_bucket(m), ACTIVATION=_ACTIVATION_CODES[activation], HAS_BIAS=bias is not None,
            )
        else:
            _linear_act_kernel[grid](
                rows_in, weight, bias if bias is not None else weight, out, m, n, k, _rows_bucket(m),
                rows_in.stride(0), weight.stride(0), out.stride(0),
                ACTIVATION=_ACTIVATION_CODES[activation], HAS_BIAS=bias is not None,
            )
    return out.view(*x.shape[:-1], n)


def triton_tma_linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    """``triton_linear_act`` on the TMA variant."""
    return triton_linear_act(x, weight, bias, activation, tma=True)


def cublas_linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    """The unfused path: cuBLAS GEMM with its bias epilogue, then the activation in one pass."""
    return fused_ops.bias_act(F.linear(x, weight, bias), activation)


ShapeKey = Tuple[int, int, int, torch.dtype, str, int]
_choices: Dict[ShapeKey, Callable[..., Tensor]] = {}
_choices_lock = threading.Lock()


def _calibrate(key: ShapeKey, x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str):
    candidates = {"cuBLAS + bias_act": cublas_linear_act, "Triton epilogue": triton_linear_act}
    if tma_unavailable_reason(x, weight) is None:
        candidates["Triton TMA epilogue"] = triton_tma_linear_act
    timings = {}
    for name, function in candidates.items():
        try:
            timings[name] = median_cuda_ms(lambda: function(x, weight, bias, activation))
        except Exception as error:  # noqa: BLE001 - a kernel that does not compile here simply loses
            logger.warning("c_fc+%s for %s: %s failed (%s: %s)", activation, key[:3], name,
                           type(error).__name__, error)
    winner = min(timings, key=timings.get)
    logger.info("c_fc+%s rows~%d N=%d K=%d %s: %s -> %s", activation, key[0], key[1], key[2],
                str(key[3]).replace("torch.", ""), ", ".join(f"{n} {t:.3f} ms" for n, t in timings.items()), winner)
    return candidates[winner]


def linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    """``activation(F.linear(x, weight, bias))`` on whichever of the two paths measured faster for this shape.

    Eager inference only (the caller routes autograd and tracing to ``fused_ops``). Numerically both paths are
    the unfused definition up to the GEMM's summation order.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows < MIN_ROWS or unavailable_reason(x, weight) is not None:
        return cublas_linear_act(x, weight, bias, activation)
    key = (_rows_bucket(rows), weight.shape[0], weight.shape[1], x.dtype, activation, x.device.index or 0)
    choice = _choices.get(key)
    if choice is None:
        if torch.cuda.is_current_stream_capturing():  # timing would break the capture: not now
            return cublas_linear_act(x, weight, bias, activation)
        with _choices_lock:
            choice = _choices.get(key)
            if choice is None:
                choice = _choices[key] = _calibrate(key, x, weight, bias, activation)
    return choice(x, weight, bias, activation)


def tuned_config() -> Optional[str]:
    """The tile Triton's autotuner picked last (for result files)."""
    if triton is None:
        return None
    configs = {name: getattr(kernel, "best_config", None)
               for name, kernel in (("pointer", _linear_act_kernel), ("tma", _linear_act_tma_kernel))}
    return "; ".join(f"{name}: {config}" for name, config in configs.items() if config is not None) or None


def calibrated_choices() -> Dict[str, str]:
    """What the calibration chose per shape so far (for reports and result files)."""
    return {f"rows~{k[0]} N={k[1]} K={k[2]} {str(k[3]).replace('torch.', '')} {k[4]}":
            _CHOICE_NAMES.get(v, v.__name__) for k, v in _choices.items()}


_CHOICE_NAMES = {cublas_linear_act: "cublas+bias_act", triton_linear_act: "triton_epilogue",
                 triton_tma_linear_act: "triton_tma_epilogue"}
