#!/usr/bin/env python
"""Time a text tower's four projections at a packed batch's token count, with and without their bias epilogue.

A packed 1,024-caption batch through ViT-L-14's text tower spends about two thirds of its device time in the
GEMMs of its blocks (qkv, out, c_fc, c_proj), and cuBLAS picks a kernel per shape: with its bias epilogue c_fc ran
at a lower rate than the other three in a profile. For each projection this reports, CUDA-event medians of
three alternating blocks: ``F.linear`` with its bias (what a patched block runs), without it (the floor a bias
moved into the next elementwise pass could reach), and the bias added by a separate pass after the GEMM; each
as milliseconds and TFLOP/s, and the whole tower's sum over ``--layers`` blocks.

    python benchmarks/bench_text_gemms.py --tokens 25600 --markdown out.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402
from benchmarks.harness.timing import alternating_median_ms  # noqa: E402


def projections(width: int, mlp_width: int) -> Dict[str, tuple]:
    """(out features, in features) of each projection of a residual block."""
    return {"qkv": (3 * width, width), "out": (width, width), "c_fc": (mlp_width, width), "c_proj": (width, mlp_width)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=25_600, help="packed token rows (1,024 web captions: ~25,500)")
    parser.add_argument("--width", type=int, default=768, help="ViT-L-14's text width")
    parser.add_argument("--mlp-width", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    args = parse_kernel_benchmark_args(parser)
    dtype = getattr(torch, args.dtype)
    header = "| projection | N x K | with bias ms | TFLOP/s | no bias ms | TFLOP/s | bias as a pass ms |"
    lines, rows = [header, "|" + "---|" * 7], []
    totals = {"with_bias": 0.0, "no_bias": 0.0, "bias_pass": 0.0}
    print(header)
    with torch.inference_mode():
        x_by_width = {}
        for name, (n, k) in projections(args.width, args.mlp_width).items():
            x = x_by_width.setdefault(k, torch.randn(args.tokens, k, device="cuda", dtype=dtype))
            weight = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
            bias = torch.randn(n, device="cuda", dtype=dtype)
            paths: Dict[str, Callable[[], torch.Tensor]] = {
                "with_bias": lambda: F.linear(x, weight, bias),
                "no_bias": lambda: F.linear(x, weight),
                "bias_pass": lambda: F.linear(x, weight).add_(bias),
            }
            ms = alternating_median_ms(paths, args.repeats)
            flop = 2.0 * args.tokens * n * k
            row = {"projection": name, "n": n, "k": k, "tokens": args.tokens, "dtype": args.dtype, "ms": ms,
                   "tflops": {path: flop / (value * 1e-3) / 1e12 for path, value in ms.items()}}
            rows.append(row)
            for path in totals:
                totals[path] += ms[path] * args.layers
            line = (f"| {name} | {n} x {k} | {ms['with_bias']:.3f} | {row['tflops']['with_bias']:.0f} | "
                    f"{ms['no_bias']:.3f} | {row['tflops']['no_bias']:.0f} | {ms['bias_pass']:.3f} |")
            lines.append(line)
            print(line, flush=True)
    total_line = (f"| all four x {args.layers} layers | | {totals['with_bias']:.2f} | | {totals['no_bias']:.2f} | | "
                  f"{totals['bias_pass']:.2f} |")
    lines.append(total_line)
    print(total_line)
    rows.append({"projection": "total", "layers": args.layers, "ms": totals})
    title = (f"A text tower's projections at {args.tokens:,} packed tokens ({args.dtype}, width {args.width}, MLP "
             f"{args.mlp_width}): CUDA-event medians of {args.repeats} calls, median of 3 alternating blocks.")
    write_microbenchmark(args.json, args.markdown, title, lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
