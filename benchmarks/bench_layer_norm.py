#!/usr/bin/env python
"""Time the residual update + LayerNorm between two blocks: stock's passes against clip_flash's add_layer_norm.

For each tower's residual stream (batch x tokens rows, width columns) it reports the device time of one call as
it runs inside an encoder's CUDA graph: ``--calls`` calls back to back captured in one graph, the replay timed
with CUDA events (median of ``--repeats`` replays, median of 3 alternating blocks), divided by the calls. Stock's
passes are what an OpenCLIP block runs there (``x + delta``, then ``LayerNormFp32``: cast, normalize, cast
back). It checks that add_layer_norm's outputs stay within stock's error of the fp32 formula.

    python benchmarks/bench_layer_norm.py --batch-sizes 1 8 64 256 --markdown out.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clip_flash.ops import fused_ops  # noqa: E402
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402
from benchmarks.harness.timing import graph_ms_per_call  # noqa: E402

# (width, tokens per sequence) of each tower's residual stream (open_clip configs).
TOWERS = {"ViT-B-32 image": (768, 50), "ViT-B-16 image": (768, 197), "ViT-L-14 image": (1024, 257),
          "ViT-H-14 image": (1280, 257), "ViT-L-14 text": (768, 77)}
EPS = 1e-5


def stock_passes(residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    updated = residual + delta
    normed = F.layer_norm(updated.float(), updated.shape[-1:], weight.float(), bias.float(), EPS)
    return updated, normed.to(updated.dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", nargs="+", choices=list(TOWERS), default=list(TOWERS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--calls", type=int, default=24, help="calls per captured graph (a ViT-L-14 has 24 blocks)")
    args = parse_kernel_benchmark_args(parser, repeats=50)
    dtype = getattr(torch, args.dtype)
    header = "| tower | batch | rows x cols | stock us | add_layer_norm us | stock GB/s | add_layer_norm GB/s |"
    lines, rows = [header, "|" + "---|" * 7], []
    print(header)
    with torch.inference_mode():
        for name in args.towers:
            width, tokens = TOWERS[name]
            for batch in args.batch_sizes:
                torch.manual_seed(0)
                residual = torch.randn(batch * tokens, width, device="cuda").mul(4).to(dtype)
                delta = torch.randn(batch * tokens, width, device="cuda").to(dtype)
                weight = (1 + 0.2 * torch.randn(width, device="cuda")).to(dtype)
                bias = (0.2 * torch.randn(width, device="cuda")).to(dtype)
                paths: Dict[str, Callable[[], object]] = {
                    "stock": lambda: stock_passes(residual, delta, weight, bias),
                    "add_layer_norm": lambda: fused_ops.add_layer_norm(residual, delta, None, weight, bias, EPS),
                }
                timed: Dict[str, list] = {path: [] for path in paths}
                for _ in range(3):
                    for path, function in paths.items():
                        timed[path].append(graph_ms_per_call(function, args.calls, args.repeats))
                ms = {path: sorted(values)[1] for path, values in timed.items()}
                within = _within_stock_error(residual, delta, weight, bias)
                # Bytes: residual and delta read, updated and normed written.
                gigabytes = 4 * residual.numel() * residual.element_size() / 1e9
                rows.append(dict(tower=name, batch=batch, dtype=args.dtype, rows=residual.shape[0], cols=width,
                                 stock_us=ms["stock"] * 1e3, add_layer_norm_us=ms["add_layer_norm"] * 1e3,
                                 within_stock_error=within))
                line = (f"| {name} | {batch} | {residual.shape[0]} x {width} | {ms['stock'] * 1e3:.2f} | "
                        f"{ms['add_layer_norm'] * 1e3:.2f} | {gigabytes / ms['stock'] * 1e3:.0f} | "
                        f"{gigabytes / ms['add_layer_norm'] * 1e3:.0f} |")
                lines.append(line)
                print(line, flush=True)
    write_microbenchmark(
        args.json, args.markdown,
        f"Residual update + LayerNorm between blocks ({args.dtype}): the device time of one call, from a CUDA graph "
        f"of {args.calls} back-to-back calls (median of {args.repeats} replays, median of 3 alternating blocks); "
        "GB/s counts two reads and two writes of the matrix.", lines, rows)
    return 0


def _within_stock_error(residual, delta, weight, bias) -> bool:
    """add_layer_norm's normalized output is no further from the fp32 formula than stock's (plus one ulp)."""
    updated, normed = fused_ops.add_layer_norm(residual, delta, None, weight, bias, EPS)
    reference = F.layer_norm(residual.float() + delta.float(), residual.shape[-1:], weight.float(), bias.float(), EPS)
    _, stock = stock_passes(residual, delta, weight, bias)
    ulp = reference.abs().max().item() * (2 ** -10 if residual.dtype == torch.float16 else 2 ** -7)
    return (normed.float() - reference).abs().max().item() <= (stock.float() - reference).abs().max().item() + ulp


if __name__ == "__main__":
    raise SystemExit(main())
