#!/usr/bin/env python
"""Time a ViT's patch embedding: the stock Conv2d (cuDNN) against clip_flash's patch GEMM (cuBLAS).

For each model's conv1 (3 channels, kernel = stride = patch size, no bias, 224x224 images) it reports,
from CUDA events after warm-up (median of --repeats per block, the paths alternating in three blocks,
median block): the stock ``F.conv2d``, the patch GEMM with the patch length padded to a multiple of 8 (what
clip_flash runs), the unpadded GEMM, and each path's max and mean |error| against an fp32 conv.

    python benchmarks/bench_patch_embedding.py --batch-sizes 1 16 64 256 --json out.json --markdown out.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.timing import alternating_median_ms  # noqa: E402
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402
from clip_flash.patching.patch_embedding import patch_embedding  # noqa: E402

# (patch size, width) of each model's vision conv1 (open_clip configs).
PATCH_EMBEDDINGS = {
    "ViT-B-32": (32, 768),
    "ViT-B-16": (16, 768),
    "ViT-L-14": (14, 1024),
    "ViT-H-14": (14, 1280),
    "ViT-g-14": (14, 1408),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(PATCH_EMBEDDINGS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--dtypes", nargs="+", choices=["float16", "bfloat16"], default=["float16", "bfloat16"])
    parser.add_argument("--image-size", type=int, default=224)
    args = parse_kernel_benchmark_args(parser)
    torch.backends.cudnn.allow_tf32 = False  # the fp32 reference conv must be a true fp32 conv
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    header = ("| model | dtype | batch | cuDNN conv ms | patch GEMM ms (padded K) | patch GEMM ms (K as is) | conv / padded GEMM "  # noqa: E501
              "| conv max/mean err | GEMM max/mean err |")
    lines = [header, "|" + "---|" * 9]
    print(header)
    for name in args.models:
        patch, width = PATCH_EMBEDDINGS[name]
        torch.manual_seed(0)
        weight32 = torch.randn(width, 3, patch, patch, device="cuda") * (3 * patch * patch) ** -0.5
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            weight = weight32.to(dtype)
            for batch in args.batch_sizes:
                images = torch.randn(batch, 3, args.image_size, args.image_size, device="cuda").to(dtype)
                paths = {
                    "conv": lambda: F.conv2d(images, weight, stride=patch),
                    "gemm_padded": lambda: patch_embedding(images, weight, pad=True),
                    "gemm": lambda: patch_embedding(images, weight, pad=False),
                }
                ms = alternating_median_ms(paths, args.repeats)
                reference = F.conv2d(images.float(), weight.float(), stride=patch)
                errors = {}
                for path in ("conv", "gemm_padded"):
                    diff = (paths[path]().float() - reference).abs()
                    errors[path] = (diff.max().item(), diff.mean().item())
                row = dict(model=name, dtype=dtype_name, batch=batch, patch=patch, width=width,
                           conv_ms=ms["conv"], gemm_padded_ms=ms["gemm_padded"], gemm_unpadded_ms=ms["gemm"],
                           speedup=ms["conv"] / ms["gemm_padded"],
                           conv_max_err=errors["conv"][0], conv_mean_err=errors["conv"][1],
                           gemm_max_err=errors["gemm_padded"][0], gemm_mean_err=errors["gemm_padded"][1])
                rows.append(row)
                line = (f"| {name} | {dtype_name} | {batch} | {ms['conv']:.4f} | {ms['gemm_padded']:.4f} | "
                        f"{ms['gemm']:.4f} | {row['speedup']:.2f}x | {errors['conv'][0]:.2e} / {errors['conv'][1]:.2e} "
                        f"| {errors['gemm_padded'][0]:.2e} / {errors['gemm_padded'][1]:.2e} |")
                lines.append(line)
                print(line, flush=True)
    write_microbenchmark(
        args.json, args.markdown,
        f"Patch embedding (conv1); CUDA events, median of {args.repeats} calls per block, median of 3 alternating "
        f"blocks; errors against an fp32 conv (TF32 off).", lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
