#!/usr/bin/env python
"""Time the activation pass after c_fc: torch's activation (stock's pass) against clip_flash's bias_act.

For each model's MLP output (batch x tokens rows, mlp-width columns: a vision tower's, or a text tower's packed
captions of about 25 tokens each) it reports CUDA-event medians (three alternating blocks of --repeats calls,
median block) and the achieved bandwidth (bytes read + written per call / time), with a plain copy of the matrix
as the memory's floor, and checks that every path gives the same values as the fp32 formula rounded once.

    python benchmarks/bench_activation.py --batch-sizes 64 256 --markdown out.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clip_flash.ops import fused_ops  # noqa: E402
from benchmarks.harness.timing import alternating_median_ms  # noqa: E402
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402

# (mlp width, tokens per image) of each model's vision tower (open_clip configs), and (mlp width, packed tokens per
# web caption) of two text towers.
MLPS = {"ViT-B-32": (3072, 50), "ViT-B-16": (3072, 197), "ViT-L-14": (4096, 257),
        "ViT-H-14": (5120, 257), "ViT-g-14": (6144, 257), "ViT-B-32-text": (2048, 25), "ViT-L-14-text": (3072, 25)}

TORCH_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # open_clip's QuickGELU: three kernels
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MLPS), default=list(MLPS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--activations", nargs="+", choices=list(TORCH_ACTIVATIONS), default=["gelu"])
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    args = parse_kernel_benchmark_args(parser)
    dtype = getattr(torch, args.dtype)
    header = ("| model | batch | activation | torch ms | bias_act ms | copy ms | torch GB/s | bias_act GB/s | "
              "copy GB/s |")
    lines, rows = [header, "|" + "---|" * 9], []
    print(header)
    for name in args.models:
        width, tokens = MLPS[name]
        for batch in args.batch_sizes:
            torch.manual_seed(0)
            x = torch.randn(batch * tokens, width, device="cuda").to(dtype)
            copy = torch.empty_like(x)
            for activation in args.activations:
                paths = {
                    "torch": lambda: TORCH_ACTIVATIONS[activation](x),
                    # Out of place like torch's (eager bias_act would overwrite x, and then time GELU of GELU ...).
                    "bias_act": lambda: fused_ops._bias_act_impl(x, activation, in_place=False),
                    "copy": lambda: copy.copy_(x),  # one read and one write, no arithmetic
                }
                ms = alternating_median_ms(paths, args.repeats)
                expected = fused_ops._bias_act_reference(x, activation)
                same = torch.equal(paths["bias_act"](), expected)
                gigabytes = 2 * x.numel() * x.element_size() / 1e9
                row = dict(model=name, batch=batch, activation=activation, dtype=args.dtype, rows=x.shape[0],
                           cols=width, torch_ms=ms["torch"], bias_act_ms=ms["bias_act"], copy_ms=ms["copy"],
                           bias_act_equals_reference=same)
                rows.append(row)
                line = (f"| {name} | {batch} | {activation} | {ms['torch']:.4f} | {ms['bias_act']:.4f} | "
                        f"{ms['copy']:.4f} | " + " | ".join(f"{gigabytes / ms[path] * 1e3:.0f}" for path in ms) + " |")
                lines.append(line)
                print(line, flush=True)
    write_microbenchmark(
        args.json, args.markdown,
        f"Activation pass after c_fc ({args.dtype}); CUDA events, median of {args.repeats} calls per block, median "
        f"of 3 alternating blocks; GB/s counts one read and one write of the matrix.", lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
