#!/usr/bin/env python
"""Time c_fc + activation of OpenCLIP ViT MLPs: cuBLAS GEMM + bias_act pass vs the Triton epilogue kernel.

For each model's vision MLP (rows = batch x tokens, N = mlp width, K = width) it reports, from CUDA events
after warm-up (median of --repeats, the two paths alternating): the bare cuBLAS GEMM with bias (the floor
any epilogue fusion can reach), cuBLAS + clip_flash's bias_act pass (today's fused path), the Triton kernel
with the activation in its epilogue (pointer loads, and TMA loads on sm90+), and the max difference between
the fused and unfused outputs.

    python benchmarks/bench_gemm_epilogue.py --models ViT-B-32 ViT-L-14 --batch-sizes 64 256 --json out.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clip_flash.ops import fused_ops  # noqa: E402
from clip_flash.ops.experimental import gemm_epilogue  # noqa: E402
from benchmarks.harness.timing import alternating_median_ms  # noqa: E402
from clip_flash.info import environment  # noqa: E402

# (width, mlp width, tokens per image, activation) of each model's vision tower (open_clip configs).
VISION_MLPS = {
    "ViT-B-32": (768, 3072, 50, "gelu"),
    "ViT-B-16": (768, 3072, 197, "gelu"),
    "ViT-L-14": (1024, 4096, 257, "gelu"),
    "ViT-H-14": (1280, 5120, 257, "gelu"),
    "ViT-g-14": (1408, 6144, 257, "gelu"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(VISION_MLPS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    rows_out = []
    print(f"{'model':10} {'batch':>5} {'rows':>7} {'N':>5} {'K':>5} {'gemm':>8} {'gemm+act':>9} "
          f"{'triton':>8} {'tma':>8} {'best/unfused':>12} {'max|diff|':>9}  config")
    for name in args.models:
        width, hidden, tokens, activation = VISION_MLPS[name]
        weight = (torch.randn(hidden, width, device="cuda") * width ** -0.5).to(dtype)
        bias = (torch.randn(hidden, device="cuda") * 0.02).to(dtype)
        for batch in args.batch_sizes:
            x = torch.randn(batch * tokens, width, device="cuda").to(dtype)
            gemm = lambda: F.linear(x, weight, bias)  # noqa: E731
            unfused = lambda: fused_ops.bias_act(F.linear(x, weight, bias), activation)  # noqa: E731
            fused = lambda: gemm_epilogue.triton_linear_act(x, weight, bias, activation)  # noqa: E731
            paths = {"gemm": gemm, "unfused": unfused, "fused": fused}
            if gemm_epilogue.tma_unavailable_reason(x, weight) is None:
                paths["tma"] = lambda: gemm_epilogue.triton_tma_linear_act(x, weight, bias, activation)  # noqa
            for fn in paths.values():  # compile, autotune, warm up
                for _ in range(3):
                    fn()
            torch.cuda.synchronize()
            ms = alternating_median_ms(paths, args.repeats)
            ms.setdefault("tma", float("nan"))
            best = min(ms["fused"], ms["tma"]) if ms["tma"] == ms["tma"] else ms["fused"]
            diff = max((paths[path]().float() - unfused().float()).abs().max().item()
                       for path in ("fused", "tma") if path in paths)
            row = dict(model=name, batch=batch, rows=x.shape[0], n=hidden, k=width, activation=activation,
                       dtype=args.dtype, gemm_ms=ms["gemm"], cublas_bias_act_ms=ms["unfused"],
                       triton_epilogue_ms=ms["fused"], triton_tma_epilogue_ms=ms["tma"],
                       speedup=ms["unfused"] / best, max_abs_diff=diff,
                       triton_config=gemm_epilogue.tuned_config())
            rows_out.append(row)
            print(f"{name:10} {batch:5d} {row['rows']:7d} {hidden:5d} {width:5d} {ms['gemm']:8.3f} "
                  f"{ms['unfused']:9.3f} {ms['fused']:8.3f} {ms['tma']:8.3f} {row['speedup']:12.2f} {diff:9.2e}  "
                  f"{row['triton_config']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(), "command": " ".join(sys.argv),
                                         "python": platform.python_version(), "rows": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
