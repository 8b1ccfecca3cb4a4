"""The flash-attn package (Dao-AILab): ``flash_attn_func`` / ``flash_attn_varlen_func``, when installed."""
from __future__ import annotations

import functools
import importlib
import torch

from .base import HALF_DTYPES, AttentionBackend, BackendStatus, Limits


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
    limits = Limits("flash-attn", device_types=frozenset({"cuda"}), dtypes=HALF_DTYPES, max_head_dim=256,
                    head_dim_multiple=8, min_capability=(8, 0), explicit_mask=False)
    varlen_limits = limits  # flash_attn_varlen_func serves what flash_attn_func does

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

    def attend(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        if attn_mask is not None:
            raise ValueError("flash-attn takes no explicit attention mask")
        module, _ = _load()
        # flash-attn wants the last dim contiguous; the (B, L, H, D) views of a packed projection are.
        return module.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal)

    def attend_varlen(self, q, k, v, cu_seqlens, max_seqlen, causal):
        module, _ = _load()
        return module.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=causal)
