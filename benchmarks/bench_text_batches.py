#!/usr/bin/env python
"""Time caption batches as the server encodes them: cut into length groups, each group through the smallest
CUDA graph that holds it, for text graph sizes at 1, 2 or 4 per doubling (``--text-graphs-per-doubling``) and
groups cut at every length bucket or where the measured replays cost least (``--text-grouping``); with
``cost-packed`` a batch or group may instead replay a packed text graph of its real tokens
(``graphs.PackedTextGraphs``) where that is measured to cost less, and ``packed`` sends every batch whole through
the packed graphs.

For each batch size (how many captions the server's text batcher took at once) it draws ``--batches`` random
batches of web-style captions (the same for every variant), cuts each into length groups as the server does
(``serve.inputs``) and replays the text ``GraphedEncoder`` on every group, as the server's launch thread does.
Reported per variant: captions/s over the whole sequence (CUDA events around it, median of ``--rounds`` rounds
with the variants alternating), the host's launch time, groups per batch, the rows and token-rows the graphs
computed per caption, and each encoder's capture time and graph memory. The patched model's eager
``encode_text`` on the same captions in batches of ``--alone-batch`` (the serve bench's "encoder alone") is timed
beside them for scale; ``--graph-costs`` adds each graph's replay time alone (what ``cost`` grouping weighs);
``--profile-batch N`` the device's busy share over one pass of the N-caption batches (torch.profiler), and the
eager encoder's over as many calls of ``--alone-batch`` captions (with ``--profile-gap-ms G`` also the packed graphs
with the device left idle G ms after each batch, as the eager encoder's Python launches leave it). The GPU's SM
clock and power (NVML, ``harness.gpu_clocks``) are sampled through every timed round and profiled pass.

    python benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 4 --grouping buckets cost \
        --batch-sizes 64 342 1024 --graph-costs --markdown out.md
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
from benchmarks.harness.gpu_clocks import GpuClockSampler, describe  # noqa: E402
from benchmarks.harness.results import write_microbenchmark  # noqa: E402
from clip_flash.graphs.packed_text import PACKED_BUCKETS_PER_DOUBLING  # noqa: E402
from clip_flash.serve.engine import batch_buckets  # noqa: E402
from clip_flash.serve.inputs import MIN_TEXT_GROUP, length_groups  # noqa: E402
from clip_flash.serve.text_graphs import (CheapestTextEncode, ReplayCosts, cheapest_groups, cost_groups,  # noqa: E402
                                          time_text_replays)


def plan(tokens: torch.Tensor, batches: int, size: int, seed: int,
         group: Callable[[np.ndarray], List[List[int]]]) -> List[List[torch.Tensor]]:
    """``batches`` random batches of ``size`` caption rows (the same rows for a given seed), each cut into length
    groups by ``group`` (token tensors on the CPU, as the server passes them)."""
    rng = np.random.default_rng(seed)
    counts = (tokens != 0).sum(dim=1).numpy()
    out = []
    for _ in range(batches):
        rows = rng.choice(len(tokens), size, replace=False)
        out.append([tokens[rows[np.asarray(positions)]] for positions in group(counts[rows])])
    return out


def bucket_grouping(counts: np.ndarray) -> List[List[int]]:
    """The server's ``--text-grouping buckets``: a cut at every length bucket, none under 17 captions."""
    return length_groups(counts) if len(counts) > MIN_TEXT_GROUP else [list(range(len(counts)))]


def whole_or_cheapest_groups(counts: np.ndarray, costs: ReplayCosts) -> List[List[int]]:
    """The server's ``--text-grouping cost-packed`` (``serve.inputs.TextInputs.device``): the cheapest cut, or the
    batch whole where its packed encode is measured to cost less than those groups' replays."""
    groups, replays_ms = cheapest_groups(counts, costs)
    return [list(range(len(counts)))] if costs.packed(int(np.sum(counts))) < replays_ms else groups


def computed_per_caption(groups: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int],
                         length_of: Callable[[torch.Tensor], int],
                         packed: Callable[[torch.Tensor], bool] = lambda group: False) -> Tuple[float, float]:
    """(rows, rows x sequence length) computed per caption by this plan: a replayed group its graph's (padded),
    a ``packed`` one its own captions and real tokens."""
    rows = token_rows = captions = 0
    for batch in groups:
        for group in batch:
            if packed(group):
                rows += len(group)
                token_rows += int((group != 0).sum())
            else:
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


def device_busy(function: Callable[[], object]) -> Tuple[float, float, int, Dict[str, float]]:
    """(busy ms, span ms, count, device ms by kernel name) of the device's kernels and copies during ``function``,
    from torch.profiler's CUDA activity: busy is the union of their intervals, span from the first start to the
    last end. What the device idles in between is what the host's launches (or its waits) cost; the names say
    which kernels the busy time goes to (GEMMs against LayerNorm, attention, copies)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        function()
        torch.cuda.synchronize()
    events = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    by_name: Dict[str, float] = {}
    for event in events:
        by_name[event.name] = by_name.get(event.name, 0.0) + (event.time_range.end - event.time_range.start) / 1e3
    spans = sorted((event.time_range.start, event.time_range.end) for event in events)
    if not spans:
        return 0.0, 0.0, 0, by_name
    busy, (start, end) = 0.0, spans[0]
    for begin, finish in spans[1:]:
        if begin > end:
            busy += end - start
            start, end = begin, finish
        else:
            end = max(end, finish)
    busy += end - start
    return busy / 1e3, (max(finish for _, finish in spans) - spans[0][0]) / 1e3, len(spans), by_name


def run_with_gaps(encode: Callable[[torch.Tensor], torch.Tensor], batches: Sequence[Sequence[torch.Tensor]],
                  gap_ms: float) -> None:
    """Each batch's groups encoded, then the device left idle ``gap_ms`` (waited for, then a sleep)."""
    for batch in batches:
        for group in batch:
            encode(group)
        torch.cuda.synchronize()
        time.sleep(gap_ms / 1e3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 342, 1024])
    parser.add_argument("--per-doubling", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--grouping", nargs="+", choices=("buckets", "cost", "cost-packed", "packed"),
                        default=["buckets"],
                        help="how batches are cut into length groups (the server's --text-grouping; packed: every "
                             "batch whole through the packed text graphs)")
    parser.add_argument("--max-text-batch", type=int, default=1024, help="the server's --max-text-batch")
    parser.add_argument("--packed-per-doubling", type=int, default=PACKED_BUCKETS_PER_DOUBLING,
                        help="packed text graphs' token-count buckets per doubling (default: the server's)")
    parser.add_argument("--batches", type=int, default=20, help="random batches per batch size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--alone-batch", type=int, default=1024)
    parser.add_argument("--profile-batch", type=int, default=None,
                        help="for this batch size, also profile one pass per variant: the device's busy share")
    parser.add_argument("--profile-gap-ms", type=float, default=0.0,
                        help="with --profile-batch and packed grouping: also profile the packed graphs with the device "
                             "idle this long after each batch (are kernels faster when the device rests?)")
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
    from clip_flash.graphs.packed_text import PackedTextGraphs, token_buckets
    from clip_flash.models import load_model, parse_model_spec
    from clip_flash.serve.text_graphs import capture_text_graphs

    device = torch.device("cuda")
    loaded = load_model(parse_model_spec(args.model), device, args.precision)
    model = loaded.model
    clip_flash.patch(model)
    tokens = loaded.tokenizer()(web_captions(8192, seed=0))
    context = loaded.context_length
    lengths = sorted(set([n for n in DEFAULT_TEXT_LENGTHS if n <= context] + [context]))

    encoders: Dict[int, GraphedEncoder] = {}
    setup: Dict[object, Dict[str, float]] = {}
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

    # Each variant: an encoder (graph sizes per doubling) and a grouping; "cost" cuts where the replays, as timed
    # on this device (what the server does once its graphs are captured), cost least in sum.
    # "cost-packed" and "packed" also capture and time the packed text graphs (one per token-count bucket) as the
    # server does; cost-packed encodes through the server's chooser, packed through the packed graphs alone.
    groupings: Dict[Tuple[int, str], Callable[[np.ndarray], List[List[int]]]] = {}
    encodes: Dict[Tuple[int, str], Callable[[torch.Tensor], torch.Tensor]] = {}
    replay_ms: Dict[int, Dict[Tuple[int, int], float]] = {}
    packed_graphs, packed_ms = None, {}
    for per_doubling, encoder in encoders.items():
        for grouping in args.grouping:
            variant = (per_doubling, grouping)
            encodes[variant] = encoder.encode_text
            if grouping == "buckets":
                groupings[variant] = bucket_grouping
                continue
            if per_doubling not in replay_ms:
                replay_ms[per_doubling] = time_text_replays(encoder, encoder.batch_sizes, lengths, context)
            costs = ReplayCosts(replay_ms[per_doubling])
            if grouping == "cost":
                groupings[variant] = lambda counts, costs=costs: cost_groups(counts, costs)
                continue
            if packed_graphs is None:
                began = time.perf_counter()
                buckets = token_buckets(args.max_text_batch * context, args.packed_per_doubling)
                packed_graphs = PackedTextGraphs(model, max_rows=args.max_text_batch, buckets=buckets)
                packed_graphs.capture_all()
                packed_ms = packed_graphs.time_replays()
                setup["packed"] = {"graphs": len(packed_graphs.graphs), "capture_s": time.perf_counter() - began,
                                   "graph_mib": packed_graphs.space.pool_bytes(0) / 2**20}
                print(f"packed: {len(packed_graphs.graphs)} graphs captured and timed in "
                      f"{setup['packed']['capture_s']:.1f} s, {setup['packed']['graph_mib']:.0f} MiB", flush=True)
            costs.packed_points = sorted(packed_ms.items())
            chooser = CheapestTextEncode(encoder.encode_text, packed_graphs.encode_text, costs, args.max_text_batch)
            groupings[variant] = (lambda counts, costs=costs: whole_or_cheapest_groups(counts, costs)) \
                if grouping == "cost-packed" else (lambda counts: [list(range(len(counts)))])
            encodes[variant] = chooser if grouping == "cost-packed" else packed_graphs.encode_text

    alone_tokens = tokens[:args.alone_batch].to(device)
    first = next(iter(groupings))
    header = ("| captions a batch | graphs per doubling | grouping | graphs | groups a batch | rows per caption | "
              f"token-rows per caption | captions/s | host launch ms a batch | x {first[0]} per doubling, "
              f"{first[1]} |")
    lines, rows = [header, "|" + "---|" * 10], []
    profiled: List[Dict[str, object]] = []
    print(header, flush=True)
    clocks = GpuClockSampler(device)
    if not clocks.available:
        print(f"GPU clocks not sampled: {clocks.reason}", flush=True)
    with torch.inference_mode(), clocks:
        for size in args.batch_sizes:
            plans = {variant: plan(tokens, args.batches, size, seed=size, group=group)
                     for variant, group in groupings.items()}

            def run(variant: Tuple[int, str]) -> None:
                encode = encodes[variant]
                for batch in plans[variant]:
                    for group in batch:
                        encode(group)

            for variant in groupings:
                run(variant)  # warm: every graph these batches hit
            if size == args.profile_batch:
                passes = [(variant, variant[1], lambda variant=variant: run(variant)) for variant in groupings]
                if args.profile_gap_ms > 0:
                    passes += [(variant, f"{variant[1]}, device idle {args.profile_gap_ms:g} ms after each batch",
                                lambda variant=variant: run_with_gaps(encodes[variant], plans[variant],
                                                                      args.profile_gap_ms))
                               for variant in groupings if variant[1] == "packed"]
                for variant, name, function in passes:
                    clocks.label = f"profile {size} {variant[0]} {name}"
                    busy_ms, span_ms, kernels, by_name = device_busy(function)
                    top = dict(sorted(by_name.items(), key=lambda item: -item[1])[:12])
                    profiled.append(dict(batch=size, per_doubling=variant[0], grouping=name, busy_ms=busy_ms,
                                         span_ms=span_ms, kernels_per_batch=kernels / args.batches,
                                         top_kernels_ms=top, clocks=clocks.summary(clocks.label)))
            device_ms: Dict[Tuple[int, str], List[float]] = {variant: [] for variant in groupings}
            host_ms: Dict[Tuple[int, str], List[float]] = {variant: [] for variant in groupings}
            for round_ in range(args.rounds):
                order = list(groupings) if round_ % 2 == 0 else list(reversed(groupings))
                for variant in order:
                    clocks.label = f"{size} {variant[0]} {variant[1]}"
                    device_ms[variant].append(time_sequence(lambda: run(variant), host_ms[variant]))
            baseline = None
            for variant in groupings:
                per_doubling, grouping = variant
                encoder, batches = encoders[per_doubling], plans[variant]
                median_ms = statistics.median(device_ms[variant])
                rate = len(batches) * size / median_ms * 1e3
                baseline = baseline or rate
                encode = encodes[variant]
                packed = (encode.takes_packed if isinstance(encode, CheapestTextEncode)
                          else (lambda group: True) if grouping == "packed" else (lambda group: False))
                per_row, per_token_row = computed_per_caption(batches, encoder.batch_sizes, encoder.length_bucket,
                                                              packed)
                host = statistics.median(host_ms[variant]) / len(batches)
                groups = sum(len(batch) for batch in batches) / len(batches)
                rows.append(dict(batch=size, per_doubling=per_doubling, grouping=grouping,
                                 graphs=setup[per_doubling]["graphs"], capture_s=setup[per_doubling]["capture_s"],
                                 graph_mib=setup[per_doubling]["graph_mib"], groups_per_batch=groups,
                                 rows_per_caption=per_row, token_rows_per_caption=per_token_row,
                                 captions_per_s=rate, device_ms_rounds=device_ms[variant],
                                 host_launch_ms_per_batch=host,
                                 clocks=clocks.summary(f"{size} {per_doubling} {grouping}")))
                line = (f"| {size} | {per_doubling} | {grouping} | {setup[per_doubling]['graphs']} | {groups:.2f} | "
                        f"{per_row:.2f} | {per_token_row:.1f} | {rate:,.0f} | {host:.2f} | {rate / baseline:.2f} |")
                lines.append(line)
                print(line, flush=True)
        if profiled:
            # The eager encoder beside the graphs, as many calls as a pass has batches: where their device time
            # differs kernel by kernel (the graphs' bucket padding, copies, gaps between replays).
            clocks.label = "profile eager"
            busy_ms, span_ms, kernels, by_name = device_busy(
                lambda: [model.encode_text(alone_tokens) for _ in range(args.batches)])
            profiled.append(dict(batch=args.alone_batch, per_doubling="-", grouping="eager encode_text",
                                 busy_ms=busy_ms, span_ms=span_ms, kernels_per_batch=kernels / args.batches,
                                 top_kernels_ms=dict(sorted(by_name.items(), key=lambda item: -item[1])[:12]),
                                 clocks=clocks.summary(clocks.label)))
            lines += ["", f"Under torch.profiler, one pass over the {args.profile_batch}-caption batches: the device's "
                      "busy time (the union of its kernels and copies) against the span from the first to the last:",
                      "", "| graphs per doubling | grouping | kernels and copies a batch | busy ms | span ms | busy | "
                      "GPU clocks (NVML) |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {p['per_doubling']} | {p['grouping']} | {p['kernels_per_batch']:.0f} | {p['busy_ms']:.1f} | "
                      f"{p['span_ms']:.1f} | {p['busy_ms'] / p['span_ms']:.1%} | {describe(p['clocks'])} |"
                      for p in profiled]
            for p in profiled:
                which = (p["grouping"] if p["per_doubling"] == "-"
                         else f"{p['grouping']} ({p['per_doubling']} per doubling)")
                lines += ["", f"Where the device time goes, {which}, one pass: the 12 kernels that took most, ms a "
                          "batch and share of the busy time:", "",
                          "| kernel | ms a batch | share |", "|---|---|---|"]
                lines += [f"| `{name[:90]}` | {ms / args.batches:.3f} | {ms / p['busy_ms']:.1%} |"
                          for name, ms in p["top_kernels_ms"].items()]
            rows.extend(dict(profiled=p) for p in profiled)
        if args.graph_costs:
            finest = max(encoders)
            table = replay_ms.get(finest) or time_text_replays(encoders[finest], encoders[finest].batch_sizes,
                                                               lengths, context)
            lines += ["", f"One replay of each caption graph alone ({finest} per doubling; device ms, median of 2 "
                      "after a warm one, copies in and out included: `serve.text_graphs.time_text_replays`):", "",
                      "| rows | " + " | ".join(f"length {length}" for length in lengths) + " |",
                      "|---|" + "---|" * len(lengths)]
            for rows_ in encoders[finest].batch_sizes:
                lines.append(f"| {rows_} | " + " | ".join(f"{table[(rows_, length)]:.3f}" for length in lengths)
                             + " |")
            rows.extend(dict(graph_rows=r, length=length, replay_ms=ms) for (r, length), ms in table.items())
        if packed_ms:
            lines += ["", "One replay of each packed text graph alone (device ms by the tokens it computes, captions "
                      "of 5 to 49 tokens, copies in and out included: `PackedTextGraphs.time_replays`): "
                      + ", ".join(f"{tokens:,} {ms:.2f}" for tokens, ms in sorted(packed_ms.items())) + "."]
            rows.append(dict(packed_ms={str(tokens): ms for tokens, ms in packed_ms.items()}))
        alone_ms = []
        clocks.label = "eager"
        for _ in range(args.rounds):
            alone_ms.append(time_sequence(lambda: model.encode_text(alone_tokens), []))
        alone_rate = args.alone_batch / statistics.median(alone_ms) * 1e3
    if clocks.available:
        lines += ["", "The GPU's clocks while each variant's timed rounds ran (NVML every 10 ms: SM clock median and "
                  "range, power median and maximum, and the reasons NVML gave for clocks below the maximum):", "",
                  "| captions a batch | graphs per doubling | grouping | GPU clocks |", "|---|---|---|---|"]
        lines += [f"| {r['batch']} | {r['per_doubling']} | {r['grouping']} | {describe(r['clocks'])} |"
                  for r in rows if "clocks" in r and "batch" in r and "per_doubling" in r]
        lines.append(f"| {args.alone_batch} | - | eager encode_text | {describe(clocks.summary('eager'))} |")
    rows.append(dict(alone_batch=args.alone_batch, alone_captions_per_s=alone_rate, alone_ms_rounds=alone_ms,
                     clocks=clocks.summary("eager")))
    capture = "; ".join(f"{p}{' per doubling' if p != 'packed' else ''}: {s['graphs']} graphs captured in "
                        f"{s['capture_s']:.1f} s, {s['graph_mib']:.0f} MiB" for p, s in setup.items())
    lines += ["", f"Encoder alone (the patched model's eager `encode_text`, {args.alone_batch} captions a call): "
              f"{alone_rate:,.0f} captions/s. Capture: {capture}."]
    print(lines[-1])
    write_microbenchmark(
        args.json, args.markdown,
        f"Caption batches as the server encodes them, {args.model} ({loaded.spec.weights_note or loaded.spec.weights})"
        f" {args.precision}: {args.batches} random batches of web-style captions per size, grouped by token length, "
        f"each group through the smallest text CUDA graph holding it (lengths {lengths}, sizes up to "
        f"{args.max_text_batch} at {args.per_doubling} per doubling past 8), groups cut by {args.grouping}; "
        f"captions/s from CUDA events around the whole sequence, median of {args.rounds} rounds, the variants "
        "alternating.", lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
