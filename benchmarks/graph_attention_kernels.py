#!/usr/bin/env python
"""Which attention kernel each of a model's CUDA graphs runs, and what one replay costs, under the attention choice
in effect: the measured table for this GPU, the one ``CLIP_FLASH_ATTENTION_TABLE`` names, or none (torch's pick).

``clip_flash.GraphedEncoder`` captures a graph per caption batch and length bucket and per image batch, as the
server's engine does. Each graph is replayed alone (the device idle before each call, as one request's replay
runs: the host's work before the replay is inside), the median of ``--repeats``; then back to back (the mean of
``--back-to-back`` calls queued without a wait, the median of 5 such rounds: what a replay costs a loaded server);
then ``--profile-calls`` replays under torch.profiler give the device time a replay spends by kernel kind and the
names of the attention kernels that ran. Captions are ``a a a ...`` of the
bucket's token count (start and end tokens included). Compare choices in fresh processes, alternating:

    python benchmarks/graph_attention_kernels.py --model ViT-B-32 --label none --markdown none_a.md
    CLIP_FLASH_ATTENTION_TABLE=table.json python benchmarks/graph_attention_kernels.py --model ViT-B-32 \\
        --label table --markdown table_a.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List

import open_clip
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import clip_flash  # noqa: E402
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402
from benchmarks.harness.timing import back_to_back_ms  # noqa: E402
from benchmarks.profile_tower import kernel_times, kind_of  # noqa: E402
from clip_flash.backends.measured import describe_auto_choice  # noqa: E402
from clip_flash.ops.cuda_timing import median_cuda_ms  # noqa: E402

ATTENTION = "attention"  # profile_tower's kind for attention kernels


def caption_tokens(tokenizer, rows: int, length: int) -> torch.Tensor:
    """``rows`` captions of exactly ``length`` tokens, the start and end tokens included."""
    tokens = tokenizer([" ".join(["a"] * (length - 2))] * rows)
    got = int((tokens[0] != 0).sum())
    if got != length:
        raise SystemExit(f"a caption of {length - 2} words took {got} tokens, not {length}: this tokenizer differs")
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B-32", help="OpenCLIP model name (random-init weights)")
    parser.add_argument("--precision", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--label", required=True, help="names this run's attention choice in the results")
    parser.add_argument("--text-rows", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--text-lengths", nargs="+", type=int, default=[8, 16, 32, 77])
    parser.add_argument("--image-rows", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--profile-calls", type=int, default=20)
    parser.add_argument("--back-to-back", type=int, default=20, help="calls queued without a wait, a round")
    args = parse_kernel_benchmark_args(parser, repeats=200)
    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(args.model, pretrained=None, precision=args.precision,
                                                         device="cuda")
    model.eval()
    report = clip_flash.patch(model)
    tokenizer = open_clip.get_tokenizer(args.model)
    encoder = clip_flash.GraphedEncoder(model, batch_sizes=sorted(set(args.text_rows + args.image_rows)),
                                        text_lengths=args.text_lengths)
    size = model.visual.image_size
    size = size if isinstance(size, int) else size[0]
    dtype = model.visual.conv1.weight.dtype
    cases: List[tuple] = [("text", rows, length) for rows in args.text_rows for length in args.text_lengths]
    cases += [("image", rows, size) for rows in args.image_rows]
    choice = describe_auto_choice()
    header = ("| graph | replay ms alone | replay ms back to back | attention us a replay | GEMM us | other us | "
              "attention kernels (us a replay) |")
    lines, rows_out = [header, "|" + "---|" * 7], []
    print(f"{args.label}: {choice}; backends {report.backends_used()}", flush=True)
    print(header, flush=True)
    with torch.inference_mode():
        for tower, rows, length in cases:
            if tower == "text":
                x = caption_tokens(tokenizer, rows, length).cuda()
                replay: Callable[[], torch.Tensor] = lambda x=x: encoder.encode_text(x)  # noqa: E731
            else:
                x = torch.randn(rows, 3, size, size, device="cuda", dtype=dtype)
                replay = lambda x=x: encoder.encode_image(x)  # noqa: E731
            ms = median_cuda_ms(replay, args.repeats, each_alone=True)
            queued_ms = back_to_back_ms(replay, args.back_to_back)
            by_kind, by_name = kernel_times(replay, args.profile_calls)
            attention: Dict[str, float] = {}
            for name, kernel_ms in by_name.items():
                if kind_of(name) == ATTENTION:
                    attention[name] = kernel_ms * 1e3
            gemm_us = by_kind.get("GEMM", 0.0) * 1e3
            attention_us = by_kind.get(ATTENTION, 0.0) * 1e3
            other_us = sum(by_kind.values()) * 1e3 - gemm_us - attention_us
            graph = f"{tower} {rows} x {length}"
            rows_out.append({"graph": graph, "tower": tower, "rows": rows, "length": length, "replay_ms": ms,
                             "back_to_back_ms": queued_ms,
                             "device_us_by_kind": {k: v * 1e3 for k, v in by_kind.items()},
                             "attention_kernels_us": attention})
            ranked = sorted(attention.items(), key=lambda kv: -kv[1])
            names = "; ".join(f"`{name[:70]}` {us:.1f}" for name, us in ranked)
            line = (f"| {graph} | {ms:.4f} | {queued_ms:.4f} | {attention_us:.1f} | {gemm_us:.1f} | {other_us:.1f} "
                    f"| {names} |")
            lines.append(line)
            print(line, flush=True)
    stats = encoder.stats()
    if stats.eager_calls or stats.failed_captures:
        print(f"warning: {stats.eager_calls} calls ran eager; failed captures: {stats.failed_captures}", flush=True)
    title = (f"{args.model} {args.precision}, attention choice `{args.label}`: {choice}. Each graph of "
             f"clip_flash.GraphedEncoder replayed alone (median of {args.repeats}) and back to back (mean of "
             f"{args.back_to_back} queued calls, median of 5 rounds), device time by kernel kind over "
             f"{args.profile_calls} replays (torch.profiler); {stats.eager_calls} calls ran eager.")
    write_microbenchmark(args.json, args.markdown, title, lines, rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
