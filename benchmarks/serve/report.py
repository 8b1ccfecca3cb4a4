"""The serve bench's results: the targets of issue 28 checked against the curves, and the markdown report.

The results JSON (``serve_bench.json``) holds ``environment``, ``runs`` (each command that added to it),
``encoder`` (per model, the encoder-alone rates), ``configs`` (per server: how it was started, its curves and
wrk check) and ``targets``. Several commands may write into one results folder (a run split to fit a
machine's time limit); each replaces the configurations it ran and the targets are checked again over all.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from benchmarks.harness.gpu_clocks import describe

# Issue 28's targets, for the H100 host, fp16, ViT-L-14 unless said.
IMAGE_SHARE_OF_ENCODER = 0.85
LATENCY_RATE_RPS = 50.0
LATENCY_P50_MS, LATENCY_P99_MS = 6.0, 12.0
CAPTION_RPS = 10_000.0
CAPTIONS64_ITEMS_PER_S = 100_000.0
SMALL_GPU_DECODE_RPS = 8_000.0
OVER_OPERATOR = 10.0
TWO_GPU_SCALING = 1.8


def _curve(results: Dict[str, Any], config: str, workload: str) -> Optional[Dict[str, Any]]:
    return ((results.get("configs", {}).get(config) or {}).get("curves") or {}).get(workload)


def _best(results: Dict[str, Any], config: str, workload: str, key: str = "requests_per_s") -> Optional[float]:
    curve = _curve(results, config, workload)
    best = curve and curve.get("throughput_at_target")
    return best[key] if best else None


def _target(name: str, required: str, measured: Optional[float], threshold: Optional[float], unit: str,
            missing: str) -> Dict[str, Any]:
    if measured is None or threshold is None:
        return {"target": name, "required": required, "measured": None, "met": None, "note": missing}
    return {"target": name, "required": required, "measured": f"{measured:,.1f} {unit}".strip(),
            "met": measured >= threshold, "note": ""}


def check_targets(results: Dict[str, Any], model: str, small_model: str) -> List[Dict[str, Any]]:
    """Each target with what was measured and whether it was met (None: not measured in these results)."""
    targets = []
    encoder = (results.get("encoder", {}).get(model) or {}).get("encoder", {}).get("patched", {})
    encoder_rate = encoder.get("images_per_s")
    image = _best(results, "clip_flash", "image-raw")
    targets.append(_target(
        f"{model}, one JPEG a request (raw bytes), throughput at p99 <= 100 ms",
        f">= {IMAGE_SHARE_OF_ENCODER:.0%} of the encoder-alone batch rate"
        + (f" ({encoder_rate:,.0f} img/s -> {IMAGE_SHARE_OF_ENCODER * encoder_rate:,.0f} req/s)"
           if encoder_rate else ""),
        image, IMAGE_SHARE_OF_ENCODER * encoder_rate if encoder_rate else None, "req/s",
        "needs the clip_flash and encoder configurations"))
    curve = _curve(results, "clip_flash", "image-raw")
    point = next((p for p in (curve or {}).get("points", []) if abs(p["offered_rps"] - LATENCY_RATE_RPS) < 1e-6), None)
    required = f"p50 <= {LATENCY_P50_MS:g} ms and p99 <= {LATENCY_P99_MS:g} ms"
    if point and point["latency_ms"]["p50"] is not None:
        p50, p99 = point["latency_ms"]["p50"], point["latency_ms"]["p99"]
        targets.append({"target": f"{model}, one JPEG a request at {LATENCY_RATE_RPS:g} req/s, client's clock",
                        "required": required, "measured": f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
                        "met": p50 <= LATENCY_P50_MS and p99 <= LATENCY_P99_MS and not point["errors"], "note": ""})
    else:
        targets.append({"target": f"{model}, one JPEG a request at {LATENCY_RATE_RPS:g} req/s", "required": required,
                        "measured": None, "met": None, "note": f"no point at {LATENCY_RATE_RPS:g} req/s"})
    targets.append(_target(f"{model}, one caption a request", f">= {CAPTION_RPS:,.0f} req/s",
                           _best(results, "clip_flash", "caption"), CAPTION_RPS, "req/s", "not run"))
    targets.append(_target(f"{model}, 64 captions a request", f">= {CAPTIONS64_ITEMS_PER_S:,.0f} captions/s",
                           _best(results, "clip_flash", "captions64", "items_per_s"), CAPTIONS64_ITEMS_PER_S,
                           "captions/s", "not run"))
    targets.append(_target(f"{small_model} --decode gpu, one JPEG a request", f">= {SMALL_GPU_DECODE_RPS:,.0f} req/s",
                           _best(results, "clip_flash-small-gpu", "image-raw"), SMALL_GPU_DECODE_RPS, "req/s",
                           "not run"))
    operator = _best(results, "operator", "image-raw")
    targets.append(_target(
        f"{model}, one JPEG a request, over the first baseline (operator's server)",
        f">= {OVER_OPERATOR:g}x" + (f" ({operator:,.1f} req/s -> {OVER_OPERATOR * operator:,.0f})" if operator else ""),
        image / operator if image and operator else None, OVER_OPERATOR, "x",
        "needs the clip_flash and operator configurations (and a passing point in each)"))
    two = _best(results, "clip_flash-2gpu", "image-raw")
    targets.append(_target(f"{model}, two GPUs (--devices 0,1) over one, one JPEG a request",
                           f">= {TWO_GPU_SCALING:g}x", two / image if two and image else None, TWO_GPU_SCALING, "x",
                           "needs clip_flash-2gpu (a two-GPU machine) and clip_flash"))
    return targets


# ----- markdown ------------------------------------------------------------------------------------------------
def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _errors(errors: Dict[str, int]) -> str:
    return ", ".join(f"{kind}: {count}" for kind, count in errors.items()) or "0"


def _gpu_note(processes: Optional[List[Dict[str, Any]]]) -> str:
    if processes is None:
        return ""
    if not processes:
        return " No process held GPU memory once it was ready (nvidia-smi)."
    held = ", ".join(f"{entry['mib']:,.0f} MiB (pid {entry['pid']})" for entry in processes)
    return f" GPU memory held once it was ready (nvidia-smi): {held}."


STAGES_AFTER_ARRIVAL = ("queued", "prepare (per batch)", "encode (per batch)", "answer")


def _interval_ms(interval) -> str:
    low, high = (1e3 * value for value in interval)
    return f"{low:g}-{high:g}" if high != float("inf") else f"> {low:g}"


def _labelled(labels: Dict[str, Any], cell) -> str:
    entries = sorted(labels.items())
    return ", ".join(cell(value) if len(entries) == 1 else f"{label} {cell(value)}"
                     for label, value in entries) or "-"


def _tail_table(points: List[Dict[str, Any]]) -> List[str]:
    """Per point: the share of requests past a bound under its p99 on the client's clock and on the server's,
    and the bucket holding each server stage's own p99 (``server_metrics``)."""
    rows = []
    for point in points:
        tail = point.get("server_tail")
        if not tail or "bound_ms" not in tail:  # /metrics gave no bound (the GPU's clocks may still be there)
            continue
        client = tail["client_share"]
        requests = _labelled(tail["server"].get("request") or {}, lambda entry: f"{entry['share']:.2%}")
        stages = [_labelled((tail.get("server_p99_s") or {}).get(stage) or {}, _interval_ms)
                  for stage in STAGES_AFTER_ARRIVAL]
        rows.append(f"| {point['offered_rps']:,.1f} | {tail['bound_ms']:g} | "
                    f"{'-' if client is None else f'{client:.2%}'} | {requests} | " + " | ".join(stages) + " |")
    if not rows:
        return []
    return ["Where each point's slow requests were: the share past a bound under its p99 on the client's clock and "
            "on the server's (from arrival in the app to the response body), and the bucket (ms) holding each "
            "server stage's own p99 (`/metrics` read between points; the server's counts include the point's "
            "warm-up seconds). A share the server's clock also shows lies inside the server, its stages' p99 say "
            "where; one only the client shows lies outside it (HTTP parsing, the network stack, the load "
            "generator).", "",
            "| offered req/s | past (ms) | client | server | queued p99 | prepare p99 (per batch) "
            "| encode p99 (per batch) | answer p99 |",
            "|---|---|---|---|---|---|---|---|", *rows, ""]


def render_markdown(results: Dict[str, Any]) -> str:
    env = results.get("environment", {})
    versions = env.get("clip_flash_environment", {})
    lines = [
        "# Serve bench: open-loop latency and throughput",
        "",
        f"Device: `{env.get('device_name')}`; torch {versions.get('torch')}, CUDA {versions.get('cuda')}, "
        f"open_clip {versions.get('open_clip')}, clip_flash {versions.get('clip_flash')}, Python {env.get('python')}.",
        f"Git revision: `{env.get('git_revision')}`.",
        "",
        "Commands:",
        "",
        *[f"- `{run['command']}` ({run['started']}, {run['elapsed_s']:.0f} s, `{run.get('device_name')}`, git "
          f"`{str(run.get('git_revision'))[:12]}`)" for run in results.get("runs", [])],
        "",
        *(["**These results come from more than one device or revision (see the commands above): compare only "
           "numbers taken on the same one.**", ""]
          if len({(run.get("device_name"), run.get("git_revision")) for run in results.get("runs", [])}) > 1
          else []),
        "Method: Poisson arrivals at each offered rate from several client processes (open loop), latency from each "
        "request's scheduled send time to its last response byte on the client's clock, merged in an HDR histogram; "
        "requests scheduled in the warm-up are not counted. *arrived*: requests scheduled in the measured window per "
        "second (Poisson, so near the offer); *achieved*: those answered successfully, per second of the window "
        "plus the time its backlog took (the arrival rate when the server keeps up, its capacity when it does not). "
        "A point meets the target when p99 <= "
        f"{results.get('settings', {}).get('p99_target_ms', 100):g} ms and at most "
        f"{results.get('settings', {}).get('max_error_fraction', 0.001):.1%} of its requests failed. "
        "*lag p99*: how late the generator itself sent (already inside the latencies; large values mean the "
        "generator, not the server, was the limit).",
        "",
    ]
    if results.get("targets"):
        lines += ["## Targets", "", "| target | required | measured | met |", "|---|---|---|---|"]
        for target in results["targets"]:
            met = {True: "yes", False: "**no**", None: "not measured"}[target["met"]]
            measured = target["measured"] or target["note"]
            lines.append(f"| {target['target']} | {target['required']} | {measured} | {met} |")
        lines.append("")
    if results.get("encoder"):
        lines += ["## Encoder alone (same host, separate process)", "",
                  "| model | precision | stock img/s | patched img/s | stock captions/s | patched captions/s "
                  "| batches |",
                  "|---|---|---|---|---|---|---|"]
        for model, record in results["encoder"].items():
            rates = record["encoder"]
            lines.append(
                f"| {model} {rates.get('weights') or ''} | {rates['precision']} | "
                f"{rates['stock']['images_per_s']:,.0f} | "
                f"{rates['patched']['images_per_s']:,.0f} | {rates['stock']['captions_per_s']:,.0f} | "
                f"{rates['patched']['captions_per_s']:,.0f} | {rates['image_batch']} images, {rates['text_batch']} "
                f"captions ({rates['timing']}) |")
        lines.append("")
    for name, config in results.get("configs", {}).items():
        lines += [f"## {name}: {config.get('description', '')}", ""]
        if config.get("skipped"):
            lines += [f"Not run: {config['skipped']}", ""]
            continue
        ready = (f"Ready after {config['ready_after_s']:.1f} s" if config.get("ready_after_s") is not None
                 else "Never ready")
        lines += [f"Command: `{config.get('command')}`. {ready}; exit status after SIGTERM: "
                  f"{config.get('exit_status')}." + _gpu_note(config.get("gpu_processes")), ""]
        if config.get("error"):
            lines += [f"Error: {config['error']}", ""]
            if config.get("log_tail"):
                lines += ["Last lines of its log:", "", "```", config["log_tail"], "```", ""]
        for workload, curve in (config.get("curves") or {}).items():
            best = curve.get("throughput_at_target")
            summary = (f"**{best['requests_per_s']:,.1f} req/s ({best['items_per_s']:,.1f} items/s)** at p99 <= "
                       f"{curve['p99_target_ms']:g} ms" if best else "no point met the target")
            lines += [f"### {workload}: {curve['workload_description']}", "", summary
                      + (f"; {curve['note']}" if curve.get("note") else ""), "",
                      "| offered req/s | arrived req/s | achieved req/s | items/s | p50 ms | p90 ms | p99 ms "
                      "| p99.9 ms "
                      "| errors | lag p99 ms | meets |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for point in curve["points"]:
                latency = point["latency_ms"]
                lines.append(
                    f"| {point['offered_rps']:,.1f} | {point['arrival_rps']:,.1f} | {point['achieved_rps']:,.1f} | "
                    f"{point['achieved_items_per_s']:,.1f} | {_ms(latency['p50'])} | {_ms(latency['p90'])} | "
                    f"{_ms(latency['p99'])} | {_ms(latency['p99.9'])} | {_errors(point['errors'])} | "
                    f"{_ms(point['send_lag_ms']['p99'])} | {'yes' if point['meets_target'] else 'no'} |")
            lines.append("")
            lines += _tail_table(curve["points"])
            lines += _clock_lines(curve["points"])
            for tower, means in (curve.get("server_metrics") or {}).items():
                lines += [f"Server's /metrics over the curve, {tower} tower: " + ", ".join(
                    f"{key} {value:,.4g}" for key, value in means.items()) + ".", ""]
        for workload, problem in (config.get("workload_errors") or {}).items():
            lines += [f"### {workload}: not measured", "", problem, ""]
        wrk = config.get("wrk")
        if wrk:
            if "error" in wrk:
                lines += [f"wrk (closed loop, raw-image route): {wrk['error']}", ""]
            else:
                lines += [f"wrk (closed loop, raw-image route, {wrk['threads']} threads, {wrk['connections']} "
                          f"connections, {wrk['duration_s']:.0f} s): **{wrk['ok_per_s']:,.1f} successful req/s** "
                          f"({wrk['requests_per_s']:,.1f} answered), p50 {wrk['latency_ms']['p50']:.2f} ms, p99 "
                          f"{wrk['latency_ms']['p99']:.2f} ms, errors: {_errors(wrk['errors'])}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _clock_lines(points: List[Dict[str, Any]]) -> List[str]:
    """The GPU's SM clock and power over each point (NVML, the bench's sampler), where they were read."""
    read = [(point["offered_rps"], point["server_tail"]["gpu_clocks"]) for point in points
            if (point.get("server_tail") or {}).get("gpu_clocks")]
    if not read:
        return []
    return ["The GPU over each point (NVML every 50 ms, warm-up and backlog included): " + "; ".join(
        f"{rate:,.0f} req/s: {describe(clocks)}" for rate, clocks in read) + ".", ""]
