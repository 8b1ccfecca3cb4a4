#!/usr/bin/env python
"""Where a server's start-up goes: the engine of ``clip-flash serve`` loaded in this process as the server
loads it, with the seconds of each stage.

    python benchmarks/serve/startup_profile.py --model ViT-L-14 --results DIR [--variant as-is no-empty-cache]

Stages: importing the engine's modules, building the model (OpenCLIP's ``create_model_and_transforms``: random
init drawn on the CPU, then moved), patching, capturing the image graphs, capturing the padded text graphs,
timing their replays, capturing and timing the packed text graphs; and across all captures, the seconds spent in
what ``torch.cuda.graph`` does before each one (a device synchronize, ``empty_cache`` and the page-locked host
cache's ``_host_emptyCache``). Per graph: the capture seconds ``GraphedEncoder.stats()`` reports, warm-up
included, summed by tower and text length.

``--variant no-empty-cache`` loads with ``torch.cuda.empty_cache`` and ``torch._C._host_emptyCache`` made no-ops
(what capturing without them would save; the memory the device then holds is reported beside);
``no-cudnn-attention`` with PyTorch's cuDNN attention turned off (``clip-flash serve --no-cudnn-attention``:
``scaled_dot_product_attention`` then picks among its other kernels, which build no per-shape plan). Each variant
runs in a fresh process, in the order given. ``--cprofile N``: the N functions with the most own time in each
run's ``engine.load()`` (``cProfile``), to say what a stage spends its seconds on. ``--retime-text``: once the
engine is loaded, its padded text graphs timed again as the engine timed them (each alone) and back to back (the
mean of 10 queued replays, the median of 3 rounds), to show how repeatable the cost table that cuts caption batches
is and how much of a replay timed alone is the host's.

Writes ``startup_profile.json`` and ``startup_profile.md`` under ``--results``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VARIANTS = ("as-is", "no-empty-cache", "no-cudnn-attention")


class Stopwatch:
    """Seconds and calls of every wrapped function, by name."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, attribute: str, name: str, replace: Optional[Callable] = None) -> None:
        original = getattr(owner, attribute)
        target = replace or original

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return target(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1

        setattr(owner, attribute, timed)


def profile_once(model: str, variant: str, cprofile_top: int = 0, retime_text: bool = False) -> Dict[str, Any]:
    """Load one engine as ``clip-flash serve --model MODEL`` does (its defaults) and time it."""
    started = time.perf_counter()
    import torch

    import open_clip

    import clip_flash
    from clip_flash.serve import text_graphs
    from clip_flash.serve.config import ServeConfig
    from clip_flash.serve.engine import READY, Engine

    imported = time.perf_counter() - started
    watch = Stopwatch()
    watch.wrap(open_clip, "create_model_and_transforms", "build model (OpenCLIP)")
    watch.wrap(clip_flash, "patch", "patch")
    watch.wrap(text_graphs, "capture_text_graphs", "capture padded text graphs")
    timing_call: Dict[str, Any] = {}
    time_text_replays = text_graphs.time_text_replays

    def remember_timing_call(*args, **kwargs):  # the encoder and graphs the engine timed, to time them again
        timing_call.update(args=args, kwargs=kwargs)
        return time_text_replays(*args, **kwargs)

    watch.wrap(text_graphs, "time_text_replays", "time padded text replays", remember_timing_call)
    watch.wrap(text_graphs, "with_packed_graphs", "capture and time packed text graphs")
    watch.wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
    no_op = (lambda *args, **kwargs: None) if variant == "no-empty-cache" else None
    watch.wrap(torch.cuda, "empty_cache", "torch.cuda.empty_cache", no_op)
    watch.wrap(torch._C, "_host_emptyCache", "torch._C._host_emptyCache", no_op)

    engine = Engine(ServeConfig(model=model, cudnn_attention=variant != "no-cudnn-attention"))
    profiler = None
    if cprofile_top:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    loading = time.perf_counter()
    engine.load()
    load_seconds = time.perf_counter() - loading
    top: List[Dict[str, Any]] = []
    if profiler is not None:
        import pstats

        profiler.disable()
        entries = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive, own s, cumulative s, callers)
        for (file, line, name), (calls, _, own, cumulative, _) in sorted(entries.items(), key=lambda e: -e[1][2]):
            top.append({"function": f"{Path(file).name}:{line}({name})", "calls": calls, "own_seconds": own,
                        "cumulative_seconds": cumulative})
            if len(top) == cprofile_top:
                break
    if engine.state != READY:
        raise SystemExit(f"the engine did not load: {engine.error}")
    stats_image, stats_text = engine.graph_stats
    by_group: Dict[str, List[float]] = defaultdict(list)
    for described, seconds in {**stats_image.capture_seconds, **stats_text.capture_seconds}.items():
        parts = described.split()
        group = f"{parts[0]} {parts[2].split('/')[0]}" if parts[0] == "text" else parts[0]
        by_group[group].append(seconds)
    torch.cuda.synchronize()
    record = {
        "image_replay_ms": image_replay_ms(engine),
        "variant": variant,
        "import_seconds": imported,
        "load_seconds": load_seconds,
        "stages": {name: {"seconds": watch.seconds[name], "calls": watch.calls[name]} for name in watch.seconds},
        "capture_seconds_by_group": {group: {"graphs": len(values), "seconds": sum(values),
                                             "max_ms": max(values) * 1e3, "min_ms": min(values) * 1e3}
                                     for group, values in sorted(by_group.items())},
        "memory_reserved_mib": torch.cuda.memory_reserved() / 2**20,
        "memory_allocated_mib": torch.cuda.memory_allocated() / 2**20,
        "description": engine.description,
        "cprofile_top": top,
        # what each padded text graph's replay costs (ms, by "rows x length"): the kernels a variant picks
        "padded_text_replay_ms": {f"{rows}x{length}": ms for (rows, length), ms in sorted(engine.text_costs.ms.items())}
        if engine.text_costs is not None else {},
    }
    if retime_text and timing_call:
        record.update(retimed_text(time_text_replays, timing_call["args"], timing_call["kwargs"]))
    engine.close()
    return record


def retimed_text(time_text_replays: Callable, args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """The engine's padded text graphs timed again as it timed them, and back to back (ms by "rows x length")."""
    import torch

    from benchmarks.harness.timing import back_to_back_ms
    from clip_flash.serve.text_graphs import token_rows_of_length

    encoder, sizes, lengths, context_length = args[:4]
    again = time_text_replays(*args, **kwargs)
    queued = {}
    with torch.inference_mode():
        for rows in sizes:
            for length in lengths:
                tokens = token_rows_of_length(rows, length, context_length)
                queued[(rows, length)] = back_to_back_ms(lambda: encoder.encode_text(tokens), 10, rounds=3)
    return {"padded_text_replay_ms_again": {f"{r}x{n}": ms for (r, n), ms in sorted(again.items())},
            "padded_text_back_to_back_ms": {f"{r}x{n}": ms for (r, n), ms in sorted(queued.items())}}


IMAGE_ROWS = (1, 16, 64, 128, 256)


def image_replay_ms(engine: Any) -> Dict[str, float]:
    """Device milliseconds of the image graph's replay at a few batch sizes (the median of 5 after a warm one,
    each alone): what the kernels a variant picks cost the image tower."""
    import torch

    from clip_flash.ops.cuda_timing import median_cuda_ms
    from clip_flash.serve.engine import IMAGE

    encode = engine.batchers[IMAGE].encode
    height, width = engine.loaded.image_size
    times = {}
    with torch.inference_mode():
        for rows in IMAGE_ROWS:
            if rows > engine.config.max_batch:
                continue
            images = torch.zeros((rows, 3, height, width), dtype=engine.loaded.dtype, device="cuda")
            times[str(rows)] = median_cuda_ms(lambda: encode(images), 5, each_alone=True)
    return times


def render(results: Dict[str, Any]) -> str:
    found = results['clip_flash_environment']
    versions = ', '.join(f'{name} {found.get(name)}' for name in ('torch', 'cuda', 'open_clip'))
    lines = ["# Server start-up, stage by stage", "", f"Device: `{results.get('device_name')}`; {versions}.",
             f"Git revision: `{results.get('git_revision')}`.", "", f"Command: `{results['command']}`", "",
             "Each variant in a fresh process: the engine `clip-flash serve` builds with its defaults, loaded in this "
             "process (no HTTP frontends). Stage seconds are wall-clock around the named calls (nested: the torch "
             "calls are inside the captures).", ""]
    for run in results["runs"]:
        lines += [f"## {run['variant']}: engine loaded in {run['load_seconds']:.1f} s "
                  f"(imports {run['import_seconds']:.1f} s before it)", "", f"{run['description']}", "",
                  "| stage | seconds | calls |", "|---|---|---|"]
        for name, stage in run["stages"].items():
            lines.append(f"| {name} | {stage['seconds']:.2f} | {stage['calls']} |")
        lines += ["", "| graphs | count | capture s (warm-up included) | min ms | max ms |", "|---|---|---|---|---|"]
        for group, entry in run["capture_seconds_by_group"].items():
            lines.append(f"| {group} | {entry['graphs']} | {entry['seconds']:.2f} | {entry['min_ms']:.1f} | "
                         f"{entry['max_ms']:.1f} |")
        images = run.get("image_replay_ms") or {}
        if images:
            lines += ["", "Image graph replays: " + ", ".join(f"{rows} rows {ms:.3f} ms" for rows, ms in images.items())
                      + "."]
        replays = run.get("padded_text_replay_ms") or {}
        if replays:
            lines += ["", f"Padded text graph replays: {len(replays)}, {sum(replays.values()):.1f} ms summed; "
                          + ", ".join(f"{key} {replays[key]:.3f} ms" for key in ("1x16", "64x32", "256x32", "1024x77")
                                      if key in replays) + "."]
        for name, label in (("padded_text_replay_ms_again", "timed alone again"),
                            ("padded_text_back_to_back_ms", "back to back")):
            other = run.get(name) or {}
            if replays and other:
                lines.append("")
                lines.append(describe_retimed(replays, other, label))
        lines += ["", f"Device memory after loading: {run['memory_reserved_mib']:,.0f} MiB reserved, "
                      f"{run['memory_allocated_mib']:,.0f} MiB allocated.", ""]
        if run.get("cprofile_top"):
            lines += ["cProfile of `engine.load()` (slower under the profiler), most own time first:", "",
                      "| function | calls | own s | cumulative s |", "|---|---|---|---|"]
            lines += [f"| `{e['function']}` | {e['calls']} | {e['own_seconds']:.2f} | {e['cumulative_seconds']:.2f} |"
                      for e in run["cprofile_top"]]
            lines.append("")
    return "\n".join(lines)


def describe_retimed(first: Dict[str, float], other: Dict[str, float], label: str) -> str:
    """One sentence: how another timing of the padded text graphs compares with the engine's own, graph by graph,
    and how often a graph measured costlier than the next larger one of its length (which the cost table then
    believes)."""
    import statistics

    ratios = sorted(other[key] / first[key] for key in first if key in other and first[key] > 0)

    def inversions(times: Dict[str, float]) -> int:
        by_length: Dict[int, List[tuple]] = defaultdict(list)
        for key, ms in times.items():
            rows, length = (int(part) for part in key.split("x"))
            by_length[length].append((rows, ms))
        pairs = [(a, b) for series in by_length.values() for a, b in zip(sorted(series), sorted(series)[1:])]
        return sum(1 for (_, ms_small), (_, ms_large) in pairs if ms_small > ms_large)

    return (f"Padded text graphs {label}: {len(ratios)} graphs, the engine's time x {statistics.median(ratios):.3f} "
            f"(median; {ratios[0]:.3f}-{ratios[-1]:.3f}); a graph costlier than the next larger of its length: "
            f"{inversions(first)} in the engine's table, {inversions(other)} {label}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-L-14", help="model spec, as clip-flash serve --model takes it")
    parser.add_argument("--variant", nargs="+", choices=VARIANTS, default=["as-is"])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="list the N functions with the most own time in each run (default 0: no profiler)")
    parser.add_argument("--retime-text", action="store_true",
                        help="time the padded text graphs again once loaded, alone and back to back")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # the child process's own run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(profile_once(args.model, args.one, args.cprofile, args.retime_text)))
        return
    import torch

    from benchmarks.harness.results import environment_record

    if not torch.cuda.is_available():
        raise SystemExit("startup_profile.py times CUDA-graph capture: it needs a CUDA device")

    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    results = {**environment_record(torch.device("cuda"), command), "runs": []}
    for variant in args.variant:
        child = subprocess.run([sys.executable, __file__, "--model", args.model, "--one", variant,
                                "--cprofile", str(args.cprofile), "--results", str(args.results)]
                               + (["--retime-text"] if args.retime_text else []),
                               capture_output=True, text=True)
        if child.returncode != 0:
            raise SystemExit(f"{variant}: exit {child.returncode}\n{child.stderr[-3000:]}")
        results["runs"].append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(f"{variant}: loaded in {results['runs'][-1]['load_seconds']:.1f} s", flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "startup_profile.json").write_text(json.dumps(results, indent=2))
    (args.results / "startup_profile.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
