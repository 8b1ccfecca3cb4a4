"""The flash-attn package (Dao-AILab): ``flash_attn_func`` / ``flash_attn_varlen_func``, when installed."""
from __future__ import annotations

import functools
import importlib
from typing import List

import torch

from .base import AttentionBackend, AttentionNeeds, BackendStatus

_HALF_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _load():
    """Import flash-attn once; returns (module, error message)."""
    try:
        module = importlib.import_module("flash_attn")
        return module, None
    except Exception as exc:  # ImportError, or an ABI mismatch surfacing as OSError/RuntimeError
        return None, f"flash-attn is not importable ({type(exc).__name__}: {exc})"


class FlashAttnBackend(AttentionBackend):
    """sm80+, fp16/bf16, head dim <= 256 (any multiple of 8: ViT-H's 80 and ViT-g's 88 are valid), no masks."""

    name = "flash_attn"
    supports_varlen = True

    def status(self) -> BackendStatus:
        module, error = _load()
        if module is None:
            return BackendStatus(self.name, False, error)
        if not torch.cuda.is_available():
            return BackendStatus(self.name, False, "no CUDA device", getattr(module, "__version__", None))
        major, _ = torch.cuda.get_device_capability()
        if major < 8:
            return BackendStatus(self.name, False, f"needs compute capability >= 8.0, this GPU is sm{major}x",
                                 getattr(module, "__version__", None))
        return BackendStatus(self.name, True, version=getattr(module, "__version__", None))

    def unsupported_reasons(self, needs: AttentionNeeds) -> List[str]:
        reasons = super().unsupported_reasons(needs)
        if needs.device_type != "cuda":
            reasons.append("flash-attn runs on CUDA only")
        if needs.dtype not in _HALF_DTYPES:
            reasons.append(f"flash-attn needs fp16/bf16, got {needs.dtype}")
        if needs.head_dim > 256 or needs.head_dim % 8:
            reasons.append(f"flash-attn needs head dim a multiple of 8 and <= 256, got {needs.head_dim}")
        if needs.explicit_mask:
            reasons.append("flash-attn takes no explicit attention mask")
        if needs.capability is not None and needs.capability < (8, 0):
            reasons.append("flash-attn needs compute capability >= 8.0")
        return reasons

    def accepts(self, q: torch.Tensor) -> bool:
        return q.is_cuda and q.dtype in _HALF_DTYPES

    def attend(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        if attn_mask is not None:
            raise ValueError("flash-attn takes no explicit attention mask")
        module, _ = _load()
        # flash-attn wants the last dim contiguous; the (B, L, H, D) views of a packed projection are.
        return module.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal)

    def attend_varlen(self, q, k, v, cu_seqlens, max_seqlen, causal):
        module, _ = _load()
        return module.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=causal)
