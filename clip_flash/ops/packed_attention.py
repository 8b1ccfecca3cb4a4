"""Attention over packed short sequences (CLIP captions) on clip_flash's kernel, as a torch custom op.

The generic variable-length kernels (torch's ``varlen_attn``, flash-attn) tile 128 queries x 128 keys: on a
caption of ~25 tokens most of every tile is padding, and a packed text batch spends a quarter of its device
time there. clip_flash's kernel (``csrc/packed_attention.cu``) gives a warp 16 queries of one sequence and
head and walks the keys 16 at a time in registers, and serves what OpenCLIP's causal text towers need: head
dim 64, sequences of at most 128 tokens, float16/bfloat16, compute capability 8.0 or newer. Numerics as flash
attention's: scores, softmax and sums in fp32, probabilities rounded to the element type before they meet v.

``packed_attention`` runs the kernel where ``kernel_takes`` says it can (inference: the kernel has no backward)
and the same formula in plain PyTorch elsewhere (one sequence at a time: a reference, not a fast path).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ._extension import extension_available, extension_unavailable_reason, load_extension
from .fused_ops import call_directly

__all__ = ["HEAD_DIM", "MAX_SEQLEN", "describe_kernel", "kernel_takes", "packed_attention", "packed_attention_kernel",
           "packed_attention_reference"]

HEAD_DIM = 64  # the kernel's only head dim (every OpenCLIP causal text tower's)
MAX_SEQLEN = 128  # the longest sequence it is tested on (CLIP's context is 77)
MIN_CAPABILITY = (8, 0)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def _rows_aligned(t: Tensor) -> bool:
    # Read from strides and the storage offset (the caching allocator's blocks start 512-byte aligned), so that
    # fake tensors (torch.compile) answer too; the binding checks the pointer itself.
    return t.stride(-1) == 1 and t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0 and t.storage_offset() % 8 == 0


def kernel_takes(q: Tensor, k: Tensor, v: Tensor, max_seqlen: int) -> bool:
    """Whether the CUDA kernel serves this call: (tokens, heads, 64) fp16/bf16 CUDA tensors of one dtype with
    16-byte aligned rows, sequences of at most ``MAX_SEQLEN`` tokens, no gradient wanted (the kernel has no
    backward), a GPU of compute capability 8.0 or newer, the extension loaded. Cheap: no device work."""
    if not (q.is_cuda and q.dim() == 3 and q.shape[-1] == HEAD_DIM and q.dtype in _KERNEL_DTYPES):
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    if not 1 <= max_seqlen <= MAX_SEQLEN or k.shape != q.shape or v.shape != q.shape:
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype or not all(_rows_aligned(t) for t in (q, k, v)):
        return False
    return _capability(q.device.index) >= MIN_CAPABILITY and extension_available()


_CAPABILITIES = {}


def _capability(index: Optional[int]) -> tuple:
    index = torch.cuda.current_device() if index is None else index
    if index not in _CAPABILITIES:
        _CAPABILITIES[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITIES[index]


def packed_attention_reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, causal: bool,
                               scale: Optional[float] = None) -> Tensor:
    """The formula, one sequence at a time in fp32 (wider inputs keep their precision), rounded once."""
    math_dtype = torch.float32 if q.dtype in _KERNEL_DTYPES else q.dtype
    bounds = cu_seqlens.tolist()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        # (L, H, D) -> (H, L, D)
        heads = [t[start:end].to(math_dtype).transpose(0, 1) for t in (q, k, v)]
        out[start:end] = F.scaled_dot_product_attention(*heads, is_causal=causal, scale=scale).transpose(0, 1)
    return out


@torch.library.custom_op("clip_flash::packed_attention", mutates_args=())
def _packed_attention_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool,
                         scale: float) -> Tensor:
    if kernel_takes(q, k, v, max_seqlen):
        return load_extension().packed_attention(q, k, v, cu_seqlens, max_seqlen, causal, scale)
    return packed_attention_reference(q, k, v, cu_seqlens, causal, scale)


@_packed_attention_op.register_fake
def _packed_attention_fake(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool,
                           scale: float) -> Tensor:
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def packed_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool,
                     scale: Optional[float] = None) -> Tensor:
    """``softmax(scale * q k^T) v`` within each packed sequence; a new contiguous ``(tokens, heads, head_dim)``.

    ``q``, ``k``, ``v``: ``(tokens, heads, head_dim)``, the sequences one after another; ``cu_seqlens``: int32,
    where each starts (sequences + 1 entries, on their device); ``max_seqlen``: at least the longest sequence;
    ``scale`` defaults to ``1 / sqrt(head_dim)``. Causal: a token sees itself and the tokens before it in its
    sequence. Where a gradient is wanted, or the kernel does not take the call, the formula runs in plain
    PyTorch (one sequence at a time).
    """
    if not kernel_takes(q, k, v, max_seqlen):
        return packed_attention_reference(q, k, v, cu_seqlens, causal, scale)  # plain torch: autograd, CPU
    return packed_attention_kernel(q, k, v, cu_seqlens, max_seqlen, causal, scale)


def packed_attention_kernel(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool,
                            scale: Optional[float] = None) -> Tensor:
    """``packed_attention`` on the CUDA kernel, for a caller that has checked ``kernel_takes`` (a model's
    per-layer call, where checking twice would cost host time). Through the custom op while compiling or
    tracing, straight to the extension in plain eager inference."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if call_directly(q, k, v, cu_seqlens):
        return load_extension().packed_attention(q, k, v, cu_seqlens, int(max_seqlen), bool(causal), scale)
    return _packed_attention_op(q, k, v, cu_seqlens, int(max_seqlen), bool(causal), scale)


def describe_kernel() -> str:
    """Where a patched text tower's packed attention runs here under ``backend="auto"``, for ``clip-flash info``."""
    if not torch.cuda.is_available():
        return "the kernel needs a CUDA GPU (no CUDA device here)"
    major, minor = _capability(None)
    if (major, minor) < MIN_CAPABILITY:
        return (f"the backend's variable-length attention (the kernel needs compute capability "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}, this GPU is sm_{major}{minor})")
    reason = extension_unavailable_reason()
    if reason is not None:
        return f"the backend's variable-length attention ({reason})"
    return (f"CUDA kernel (clip_flash._C) for packed captions up to {MAX_SEQLEN} tokens, head dim {HEAD_DIM}, "
            "fp16/bf16, under backend=auto")
