#!/usr/bin/env python
"""Time attention over packed captions: torch's varlen_attn (flash) against clip_flash's packed_attention.

Each batch is ``--batch-sizes`` web-style captions (token counts from the model's tokenizer, seeded), packed one
after another as the text tower's packed forward lays them out: q, k and v strided views of one (tokens, 3,
heads, 64) projection output. One call's device time is measured as it runs inside an encoder's CUDA graph
(``--calls`` calls back to back in one graph, CUDA events around a replay, the median of ``--repeats``), the
variants alternating over ``--rounds`` rounds (the median round is reported). Each variant's largest error
against the fp32 formula is printed beside its time.

    python benchmarks/bench_packed_attention.py --batch-sizes 64 342 1024 --markdown out.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.captions import web_captions  # noqa: E402
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402
from benchmarks.harness.timing import graph_ms_per_call  # noqa: E402
from clip_flash.ops.packed_attention import kernel_takes, packed_attention, packed_attention_reference  # noqa: E402


def caption_lengths(model: str, count: int) -> np.ndarray:
    """Token counts (start and end tokens included) of ``count`` web-style captions."""
    import clip_flash

    tokens = clip_flash.get_tokenizer(model)(web_captions(count, seed=0))
    return (tokens != 0).sum(dim=1).numpy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-L-14", help="whose tokenizer counts the caption tokens")
    parser.add_argument("--heads", type=int, default=12, help="ViT-L-14's text tower has 12 heads of 64")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 342, 1024])
    parser.add_argument("--max-seqlens", nargs="+", type=int, default=[0, 77],
                        help="the max_seqlen each call passes: 0 the batch's longest caption (the eager packed path), "
                             "77 the context length (what the packed text graphs pass)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--calls", type=int, default=12, help="calls per captured graph (a ViT-L-14 text tower: 12)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parse_kernel_benchmark_args(parser)
    from torch.nn.attention.varlen import varlen_attn

    dtype = getattr(torch, args.dtype)
    pool = caption_lengths(args.model, 8192)
    rng = np.random.default_rng(0)
    header = ("| captions | tokens | longest | max_seqlen | varlen_attn us | packed_attention us | speed-up "
              "| varlen_attn max err | packed_attention max err |")
    lines, rows = [header, "|" + "---|" * 9], []
    print(header)
    with torch.inference_mode():
        for size in args.batch_sizes:
            lengths = rng.choice(pool, size, replace=False)
            total, longest = int(lengths.sum()), int(lengths.max())
            cu_seqlens = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
            qkv = torch.randn(total, 3, args.heads, 64, device="cuda", dtype=dtype)
            q, k, v = qkv.unbind(1)
            reference = packed_attention_reference(q.float(), k.float(), v.float(), cu_seqlens, causal=True)
            for max_seqlen in [m or longest for m in args.max_seqlens]:
                if not kernel_takes(q, k, v, max_seqlen):
                    raise SystemExit("packed_attention's kernel does not take this call here (extension not built?)")
                variants: Dict[str, Callable[[], torch.Tensor]] = {
                    "varlen_attn": lambda m=max_seqlen: varlen_attn(q, k, v, cu_seqlens, cu_seqlens, m, m,
                                                                    window_size=(-1, 0)),
                    "packed_attention": lambda m=max_seqlen: packed_attention(q, k, v, cu_seqlens, m, causal=True),
                }
                errors = {name: (run().float() - reference).abs().max().item() for name, run in variants.items()}
                times: Dict[str, List[float]] = {name: [] for name in variants}
                for _ in range(args.rounds):
                    for name, run in variants.items():
                        times[name].append(graph_ms_per_call(run, args.calls, args.repeats) * 1e3)
                us = {name: statistics.median(values) for name, values in times.items()}
                row = {"captions": size, "tokens": total, "longest": longest, "max_seqlen": max_seqlen,
                       "heads": args.heads, "dtype": args.dtype, "us": us, "max_abs_error_vs_fp32": errors,
                       "speed_up": us["varlen_attn"] / us["packed_attention"]}
                rows.append(row)
                line = (f"| {size} | {total:,} | {longest} | {max_seqlen} | {us['varlen_attn']:.1f} | "
                        f"{us['packed_attention']:.1f} | {row['speed_up']:.2f}x | {errors['varlen_attn']:.2e} | "
                        f"{errors['packed_attention']:.2e} |")
                lines.append(line)
                print(line, flush=True)
    title = (f"One causal attention call over packed web-style captions ({args.heads} heads of 64, {args.dtype}), "
             f"device microseconds as it runs in a CUDA graph ({args.calls} calls a graph, median of {args.repeats} "
             f"replays, median of {args.rounds} alternating rounds); max err: the largest |difference| to fp32.")
    write_microbenchmark(args.json, args.markdown, title, lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
