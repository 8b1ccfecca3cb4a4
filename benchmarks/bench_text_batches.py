#!/usr/bin/env python
"""Time caption batches as the server encodes them: grouped by token length, each group through the smallest
CUDA graph that holds it, for text graph sizes at 1, 2 or 4 per doubling (``--text-graphs-per-doubling``).

For each batch size (how many captions the server's text batcher took at once) it draws ``--batches`` random
batches of web-style captions, cuts each into length groups as the server does (``serve.inputs.length_groups``)
and replays the text ``GraphedEncoder`` on every group, as the server's launch thread does. Reported per option:
captions/s over the whole sequence (CUDA events around it, median of ``--rounds`` rounds with the options
alternating), the host's launch time, the rows and token-rows the graphs computed per caption, and each option's
capture time and graph memory. The patched model's eager ``encode_text`` on the same captions in batches of
``--alone-batch`` (the serve bench's "encoder alone") is timed beside them for scale.

    python benchmarks/bench_text_batches.py --model ViT-L-14 --batch-sizes 64 342 1024 --markdown out.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.captions import web_captions  # noqa: E402
from benchmarks.harness.results import write_microbenchmark  # noqa: E402
from clip_flash.serve.engine import batch_buckets, token_rows_of_length  # noqa: E402
from clip_flash.serve.inputs import length_groups  # noqa: E402


def plan(tokens: torch.Tensor, batches: int, size: int, seed: int) -> List[List[torch.Tensor]]:
    """``batches`` random batches of ``size`` caption rows, each as the server's length groups (token tensors on
    the CPU, as the server passes them)."""
    rng = np.random.default_rng(seed)
    counts = (tokens != 0).sum(dim=1).numpy()
    out = []
    for _ in range(batches):
        rows = rng.choice(len(tokens), size, replace=False)
        groups = length_groups(counts[rows]) if size > 16 else [list(range(size))]
        out.append([tokens[rows[np.asarray(group)]] for group in groups])
    return out


def computed_per_caption(groups: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int],
                         length_of: Callable[[torch.Tensor], int]) -> Tuple[float, float]:
    """(graph rows, graph rows x sequence length) computed per caption by this plan with these graph sizes."""
    rows = token_rows = captions = 0
    for batch in groups:
        for group in batch:
            bucket = next(size for size in sizes if size >= len(group))
            rows += bucket
            token_rows += bucket * length_of(group)
            captions += len(group)
    return rows / captions, token_rows / captions


def time_sequence(function: Callable[[], object], rounds_host: List[float]) -> float:
    """Device-clock milliseconds of one pass of ``function`` (events around it); its host time appended."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    began = time.perf_counter()
    start.record()
    function()
    end.record()
    rounds_host.append((time.perf_counter() - began) * 1e3)
    end.synchronize()
    return start.elapsed_time(end)


def _graph_costs(encoder, lengths: Sequence[int], context: int, rounds: int) -> List[Dict[str, float]]:
    """Device milliseconds of one replay of each of ``encoder``'s caption graphs alone: what a length group
    costs by its rows and length bucket (the data a grouping that weighs padding against launches needs)."""
    costs = []
    for size in encoder.batch_sizes:
        for length in lengths:
            tokens = token_rows_of_length(size, length, context)
            encoder.encode_text(tokens)  # warm
            times = [time_sequence(lambda: encoder.encode_text(tokens), []) for _ in range(rounds)]
            costs.append({"rows": size, "length": length, "ms": statistics.median(times)})
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 342, 1024])
    parser.add_argument("--per-doubling", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--max-text-batch", type=int, default=1024, help="the server's --max-text-batch")
    parser.add_argument("--batches", type=int, default=20, help="random batches per batch size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--alone-batch", type=int, default=1024)
    parser.add_argument("--graph-costs", action="store_true",
                        help="also time one replay of every caption graph alone (rows x length bucket)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")

    import clip_flash
    from clip_flash.graphs import GraphedEncoder
    from clip_flash.graphs.encoder import DEFAULT_TEXT_LENGTHS
    from clip_flash.models import load_model, parse_model_spec
    from clip_flash.serve.engine import capture_text_graphs

    device = torch.device("cuda")
    loaded = load_model(parse_model_spec(args.model), device, args.precision)
    model = loaded.model
    clip_flash.patch(model)
    tokens = loaded.tokenizer()(web_captions(8192, seed=0))
    context = loaded.context_length
    lengths = sorted(set([n for n in DEFAULT_TEXT_LENGTHS if n <= context] + [context]))

    encoders: Dict[int, GraphedEncoder] = {}
    setup: Dict[int, Dict[str, float]] = {}
    for per_doubling in args.per_doubling:
        sizes = batch_buckets(args.max_text_batch, per_doubling)
        encoder = GraphedEncoder(model, batch_sizes=sizes, text_lengths=lengths,
                                 max_graphs=len(sizes) * len(lengths))
        began = time.perf_counter()
        capture_text_graphs(encoder, sizes, lengths, context)
        torch.cuda.synchronize()
        stats = encoder.stats()
        encoders[per_doubling] = encoder
        setup[per_doubling] = {"graphs": stats.graphs, "capture_s": time.perf_counter() - began,
                               "graph_mib": stats.graph_memory_bytes / 2**20}
        print(f"{per_doubling} per doubling: {stats.graphs} text graphs in {setup[per_doubling]['capture_s']:.1f} s, "
              f"{setup[per_doubling]['graph_mib']:.0f} MiB", flush=True)

    alone_tokens = tokens[:args.alone_batch].to(device)
    header = ("| captions a batch | graphs per doubling | graphs | rows per caption | token-rows per caption | "
              f"captions/s | host launch ms a batch | x {args.per_doubling[0]} per doubling |")
    lines, rows = [header, "|" + "---|" * 8], []
    print(header, flush=True)
    with torch.inference_mode():
        for size in args.batch_sizes:
            batches = plan(tokens, args.batches, size, seed=size)

            def run(encoder: GraphedEncoder) -> None:
                for batch in batches:
                    for group in batch:
                        encoder.encode_text(group)

            for encoder in encoders.values():
                run(encoder)  # warm: every graph these batches hit
            device_ms: Dict[int, List[float]] = {p: [] for p in encoders}
            host_ms: Dict[int, List[float]] = {p: [] for p in encoders}
            for round_ in range(args.rounds):
                order = list(encoders) if round_ % 2 == 0 else list(reversed(encoders))
                for per_doubling in order:
                    device_ms[per_doubling].append(time_sequence(lambda: run(encoders[per_doubling]),
                                                                 host_ms[per_doubling]))
            baseline = None
            for per_doubling, encoder in encoders.items():
                median_ms = statistics.median(device_ms[per_doubling])
                rate = len(batches) * size / median_ms * 1e3
                baseline = baseline or rate
                per_row, per_token_row = computed_per_caption(batches, encoder.batch_sizes, encoder.length_bucket)
                host = statistics.median(host_ms[per_doubling]) / len(batches)
                rows.append(dict(batch=size, per_doubling=per_doubling, graphs=setup[per_doubling]["graphs"],
                                 capture_s=setup[per_doubling]["capture_s"],
                                 graph_mib=setup[per_doubling]["graph_mib"], rows_per_caption=per_row,
                                 token_rows_per_caption=per_token_row, captions_per_s=rate,
                                 device_ms_rounds=device_ms[per_doubling], host_launch_ms_per_batch=host))
                line = (f"| {size} | {per_doubling} | {setup[per_doubling]['graphs']} | {per_row:.2f} | "
                        f"{per_token_row:.1f} | {rate:,.0f} | {host:.2f} | {rate / baseline:.2f} |")
                lines.append(line)
                print(line, flush=True)
        graph_costs = _graph_costs(encoders[max(encoders)], lengths, context, args.rounds) if args.graph_costs else []
        if graph_costs:
            lines += ["", "One replay of each caption graph alone (device ms, median of "
                      f"{args.rounds} after a warm one; the finest sizes' encoder):", "",
                      "| rows | " + " | ".join(f"length {length}" for length in lengths) + " |",
                      "|---|" + "---|" * len(lengths)]
            for rows_ in sorted({cost["rows"] for cost in graph_costs}):
                by_length = {cost["length"]: cost["ms"] for cost in graph_costs if cost["rows"] == rows_}
                lines.append(f"| {rows_} | " + " | ".join(f"{by_length[length]:.3f}" for length in lengths) + " |")
        alone_ms = []
        for _ in range(args.rounds):
            alone_ms.append(time_sequence(lambda: model.encode_text(alone_tokens), []))
        alone_rate = args.alone_batch / statistics.median(alone_ms) * 1e3
    rows.append(dict(alone_batch=args.alone_batch, alone_captions_per_s=alone_rate, alone_ms_rounds=alone_ms))
    rows.extend(dict(graph_cost=cost) for cost in graph_costs)
    capture = "; ".join(f"{p} per doubling: {s['graphs']} graphs captured in {s['capture_s']:.1f} s, "
                        f"{s['graph_mib']:.0f} MiB" for p, s in setup.items())
    lines += ["", f"Encoder alone (the patched model's eager `encode_text`, {args.alone_batch} captions a call): "
              f"{alone_rate:,.0f} captions/s. Capture: {capture}."]
    print(lines[-1])
    write_microbenchmark(
        args.json, args.markdown,
        f"Caption batches as the server encodes them, {args.model} ({loaded.spec.weights_note or loaded.spec.weights})"
        f" {args.precision}: {args.batches} random batches of web-style captions per size, grouped by token length, "
        f"each group through the smallest text CUDA graph holding it (lengths {lengths}, sizes up to "
        f"{args.max_text_batch} at 1, 2 or 4 per doubling past 8); captions/s from CUDA events around the whole "
        f"sequence, median of {args.rounds} rounds, the options alternating.", lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
