"""Serve bench: open-loop latency/throughput curves of the clip_flash server and its baselines, one command.

    python benchmarks/serve/bench_serve.py --results DIR                       # ViT-L-14 + ViT-B-32 --decode gpu
    python benchmarks/serve/bench_serve.py --configs baselines --results DIR   # the baselines, same DIR
    python benchmarks/serve/bench_serve.py --configs stub --results /tmp/ceiling  # the generator's ceiling
    python benchmarks/serve/bench_serve.py --device cpu --precision fp32 --model ViT-B-32 --configs operator \\
        --workloads caption --rates 2,4 --duration 2 --min-requests 0 --results /tmp/smoke   # a CPU smoke run

On the H100 host (16 cores) each of the first two takes about 6 minutes (README.md: the steps there).

For each configuration (``--configs``, see ``servers.py``) it starts the server as its own process on a free
loopback port, waits for its readiness route, checks one request of each workload (status 200, one embedding
per item), runs each workload's curve (rising open-loop rates until p99 passes ``--p99-ms``, then bisection;
see ``curves.py``), cross-checks the raw-image route's peak with ``wrk``, and stops it with SIGTERM. The
``encoder`` configuration measures the encoder-alone batch rate in a separate process (the target's
yardstick). Results go to ``--results DIR``: ``serve_bench.json``, ``serve_bench.md`` and each server's log
under ``logs/``; results already in DIR from an earlier command are kept, and targets are checked over all.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``clip_flash`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.gpu_clocks import GpuClockSampler  # noqa: E402
from benchmarks.serve.curves import Curve, CurvePlan, run_curve  # noqa: E402
from benchmarks.serve.load_generator import LoadSettings, PointResult, Request, Workload  # noqa: E402
from benchmarks.serve.report import check_targets, render_markdown  # noqa: E402
from benchmarks.serve.server_metrics import (  # noqa: E402
    Scrape, bucket_bounds, curve_means, p99_intervals, scrape, shares_past, tail_bound,
)
from benchmarks.serve.servers import (  # noqa: E402
    REPO_ROOT, ServerConfig, ServerProcess, build_configs, infinity_available, raise_open_files_limit,
)
from benchmarks.serve.workloads import WORKLOAD_NAMES, build_workloads, request_captions, request_jpegs  # noqa: E402
from benchmarks.serve.wrk_check import find_wrk, run_wrk  # noqa: E402

# Groups sized to fit one command each on the H100 host (about 6 minutes each; one command may run 10).
CONFIG_GROUPS = {"main": "encoder,clip_flash,clip_flash-small-gpu", "baselines": "operator,stock-inputs,infinity,stub"}
DEFAULT_CONFIGS = "main"
# Where each workload's rising rates start: the image curves start at the 50 req/s latency target's rate.
DEFAULT_START_RPS = {"image-raw": 50.0, "image-uri": 100.0, "caption": 500.0, "captions64": 100.0, "mix": 200.0}
RESULTS_JSON, RESULTS_MD = "serve_bench.json", "serve_bench.md"


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--results", type=Path, required=True, help="folder for serve_bench.json/.md and logs")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help="comma-separated: encoder, clip_flash, clip_flash-small-gpu, clip_flash-2gpu, "
                             "stock-inputs, operator, infinity, stub, or a group: "
                             + "; ".join(f"{group} = {members}" for group, members in CONFIG_GROUPS.items())
                             + f" (default {DEFAULT_CONFIGS})")
    parser.add_argument("--model", default="ViT-L-14", help="main model spec (NAME, NAME::TAG, NAME::/path)")
    parser.add_argument("--small-model", default="ViT-B-32", help="model of clip_flash-small-gpu")
    parser.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--device", default="cuda", help="cuda or cpu (servers and encoder)")
    parser.add_argument("--workloads", default=",".join(WORKLOAD_NAMES),
                        help="comma-separated subset of " + ", ".join(WORKLOAD_NAMES))
    parser.add_argument("--server-args", default="", help="extra arguments for every clip_flash server (one string)")
    load = parser.add_argument_group("load")
    load.add_argument("--duration", type=float, default=2.0, help="measured seconds per point")
    load.add_argument("--warmup", type=float, default=0.5, help="seconds per point sent but not counted")
    load.add_argument("--processes", type=int, default=6, help="client processes")
    load.add_argument("--connections", type=int, default=256, help="connections per client process, at most")
    load.add_argument("--client", default="aiohttp", choices=("aiohttp", "httpx"))
    load.add_argument("--timeout", type=float, default=30.0, help="request timeout, seconds")
    curve = parser.add_argument_group("curves")
    curve.add_argument("--p99-ms", type=float, default=100.0, help="latency target")
    curve.add_argument("--max-error-fraction", type=float, default=0.001)
    curve.add_argument("--rates", default="", help="comma-separated rates run as listed (instead of rising)")
    curve.add_argument("--start-rps", default="", help="per workload, e.g. caption=500,captions64=50")
    curve.add_argument("--factor", type=float, default=4.0, help="rate growth per step")
    curve.add_argument("--refine", type=int, default=5, help="bisection steps after the first missed point "
                                                             "(4x steps and 5 bisections: within 4.4%%)")
    curve.add_argument("--min-requests", type=int, default=300,
                       help="a point lasts at least this many requests (low rates run longer than --duration)")
    curve.add_argument("--max-rps", type=float, default=100_000.0, help="highest rate offered")
    other = parser.add_argument_group("other")
    other.add_argument("--photos", type=Path, help="photo folder (photo-set); default scikit-image's samples")
    other.add_argument("--wrk", help="wrk binary (default .device/bin/wrk, else wrk on PATH)")
    other.add_argument("--no-wrk", action="store_true")
    other.add_argument("--wrk-threads", type=int, default=8)
    other.add_argument("--wrk-connections", type=int, default=256)
    other.add_argument("--wrk-duration", type=int, default=5)
    other.add_argument("--stub-workers", type=int, default=4, help="uvicorn processes of the stub server")
    other.add_argument("--encoder-image-batch", type=int, default=256)
    other.add_argument("--encoder-text-batch", type=int, default=1024)
    other.add_argument("--infinity-site", type=Path, help="folder with infinity-emb and its dependencies "
                                                          "(pip --target), for the infinity process only")
    other.add_argument("--infinity-batch", type=int, default=32, help="infinity's --batch-size")
    return parser.parse_args(argv)


# ----- results file ------------------------------------------------------------------------------------------
def load_results(folder: Path) -> Dict[str, Any]:
    path = folder / RESULTS_JSON
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": [], "encoder": {}, "configs": {}}


def save_results(folder: Path, results: Dict[str, Any], model: str, small_model: str) -> None:
    results["targets"] = check_targets(results, model, small_model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    (folder / RESULTS_MD).write_text(render_markdown(results))


def python_subprocess(args: List[str], log_path: Path, timeout_s: float, extra_path: Optional[Path] = None) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path) if extra_path else None, str(REPO_ROOT),
                                                      env.get("PYTHONPATH")]))
    with open(log_path, "wb") as out:
        done = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout_s, env=env)
    if done.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{' '.join(args[:3])} failed ({done.returncode}); log {log_path}:\n{tail}")


def measure_encoder(args: argparse.Namespace, model: str, logs: Path) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "encoder.json"
        python_subprocess(["-m", "benchmarks.serve.encoder_rate", "--model", model, "--precision", args.precision,
                           "--device", args.device, "--image-batch", str(args.encoder_image_batch),
                           "--text-batch", str(args.encoder_text_batch), "--out", str(out)],
                          logs / f"encoder-{model.replace('/', '_')}.log", timeout_s=900)
        return json.loads(out.read_text())


def environment(args: argparse.Namespace, logs: Path) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "environment.json"
        python_subprocess(["-m", "benchmarks.serve.encoder_rate", "--environment-only", "--device", args.device,
                           "--out", str(out)], logs / "environment.log", timeout_s=300)
        return json.loads(out.read_text())


# ----- one server --------------------------------------------------------------------------------------------
def served_model_id(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.base_url + server.config.models_path, timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def gpu_processes() -> Optional[List[Dict[str, Any]]]:
    """The processes holding GPU memory now (pid, name, MiB), from nvidia-smi; None where there is none. Read
    once a server is ready and alone on the machine: it shows the server computes on the GPU."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    rows = [line.rsplit(",", 2) for line in done.stdout.splitlines() if line.strip()]
    return [{"pid": int(pid), "name": name.strip(), "mib": float(mib)} for pid, name, mib in rows]


def check_one(base_url: str, request: Request) -> str:
    """Send one request; '' when it answered 200 with one embedding per item, else what was wrong."""
    http = urllib.request.Request(base_url + request.path, data=request.body, method="POST",
                                  headers={"Content-Type": request.content_type})
    try:
        with urllib.request.urlopen(http, timeout=120) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as error:
        return f"status {error.code}: {error.read()[:300]!r}"
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    data = body.get("data") or []
    if len(data) != request.items:
        return f"{len(data)} embeddings for {request.items} items: {str(body)[:300]}"
    for entry in data:
        vector = entry.get("embedding")
        length = len(base64.b64decode(vector)) // 4 if isinstance(vector, str) else len(vector or [])
        if length == 0:
            return f"an empty embedding: {str(entry)[:200]}"
    return ""


def curve_plan(args: argparse.Namespace, workload: str) -> CurvePlan:
    starts = dict(DEFAULT_START_RPS)
    for part in filter(None, args.start_rps.split(",")):
        name, _, value = part.partition("=")
        starts[name.strip()] = float(value)
    rates = [float(rate) for rate in args.rates.split(",") if rate.strip()] or None
    return CurvePlan(start_rps=starts.get(workload, 50.0), factor=args.factor, max_rps=args.max_rps,
                     refine_steps=args.refine, min_requests=args.min_requests, rates=rates, p99_target_ms=args.p99_ms,
                     max_error_fraction=args.max_error_fraction)


def print_point(curve: Curve, point: PointResult) -> None:
    p50, p99 = point.latency_ms(50), point.latency_ms(99)
    print(f"  {curve.server} {curve.workload.name}: offered {point.offered_rps:,.0f}/s achieved "
          f"{point.achieved_rps:,.1f}/s p50 {p50 if p50 is None else round(p50, 2)} ms p99 "
          f"{p99 if p99 is None else round(p99, 2)} ms errors {point.error_count} "
          f"{'meets' if curve.meets(point) else 'misses'}", flush=True)


class PointTails:
    """Reads the server's ``/metrics`` after each point: where that point's slow requests spent their time
    (``server_metrics.shares_past`` at the bound under the client's p99), beside the client's share past it."""

    def __init__(self, base_url: str, before: Optional[Scrape], clocks: Optional[GpuClockSampler] = None) -> None:
        self.base_url = base_url
        self.last = before
        self.points: List[Dict[str, Any]] = []
        self.clocks = clocks  # the GPU's clocks and power over each point (its warm-up and backlog included)
        self.clock_start = len(clocks.samples) if clocks is not None else 0

    def after_point(self, curve: Curve, point: PointResult) -> None:
        print_point(curve, point)
        now = scrape(self.base_url) if self.last is not None else None
        bound = tail_bound(point.latency_ms(99), bucket_bounds(now))
        tail: Dict[str, Any] = {}
        if bound is not None:
            client = point.share_slower_than(bound * 1e3)
            tail = {"bound_ms": bound * 1e3, "client_share": None if client is None else round(client, 5),
                    "server": shares_past(self.last, now, bound),
                    "server_p99_s": {stage: {label: list(interval) for label, interval in labels.items()}
                                     for stage, labels in p99_intervals(self.last, now).items()}}
        if self.clocks is not None and self.clocks.available:
            tail["gpu_clocks"] = self.clocks.summary(start=self.clock_start)
            self.clock_start = len(self.clocks.samples)
        self.points.append(tail)
        self.last = now


def run_config(args: argparse.Namespace, config: ServerConfig, jpegs: List[bytes], captions: List[str],
               wrk_jpeg: Path, logs: Path) -> Dict[str, Any]:
    record: Dict[str, Any] = {"description": config.description, "model": config.model}
    if config.name == "infinity":
        reason = infinity_available(args.infinity_site)
        if reason:
            return record | {"skipped": reason}
    server = ServerProcess(config, logs / f"{config.name}.log")
    record["command"] = shlex.join(server.command)
    # NVML's first GPU, without starting CUDA in this process (the server owns the device).
    clocks = GpuClockSampler(0, interval=0.05) if args.device.startswith("cuda") else None
    print(f"[{config.name}] starting: {record['command']}", flush=True)
    try:
        record["ready_after_s"] = round(server.wait_ready(), 2)
        print(f"[{config.name}] ready after {record['ready_after_s']} s", flush=True)
        record["gpu_processes"] = gpu_processes()
        model_id = served_model_id(server)
        wanted = [name for name in args.workloads.split(",") if name in config.workloads]
        workloads = build_workloads(model_id, jpegs, captions, config.embeddings_path, config.image_path, wanted,
                                    config.json_extra)
        if config.image_json_extra:  # infinity takes images on /embeddings only with "modality": "image"
            workloads = {name: _with_image_extra(workload, config) for name, workload in workloads.items()}
        settings = LoadSettings(processes=args.processes, duration_s=args.duration, warmup_s=args.warmup,
                                connections_per_process=args.connections, request_timeout_s=args.timeout,
                                client=args.client)
        record["curves"], record["workload_errors"] = {}, {}
        if clocks is not None:
            clocks.__enter__()
        for name, workload in workloads.items():
            problems = [problem for problem in (check_one(server.base_url, request)
                                                for request in _distinct_kinds(workload)) if problem]
            if problems:
                record["workload_errors"][name] = "the check request failed: " + problems[0]
                print(f"[{config.name}] {name}: check failed: {problems[0]}", flush=True)
                continue
            before = scrape(server.base_url)
            tails = PointTails(server.base_url, before, clocks)
            curve = run_curve(config.name, server.base_url, workload, curve_plan(args, name), settings,
                              tails.after_point)
            record["curves"][name] = curve.to_dict()
            for point, tail in zip(record["curves"][name]["points"], tails.points):
                if tail:
                    point["server_tail"] = tail
            means = curve_means(before, tails.last)
            if means:  # which stage bounds the curve: batch sizes and per-stage seconds over its points
                record["curves"][name]["server_metrics"] = means
        wrk = None if args.no_wrk else find_wrk(args.wrk)
        if config.wrk and config.image_path and "image-raw" in record["curves"]:
            if wrk is None:
                record["wrk"] = {"error": "wrk not found (apt-get install wrk, or prep-device --wrk)"}
            else:
                try:
                    record["wrk"] = run_wrk(wrk, server.base_url + config.image_path, wrk_jpeg, args.wrk_threads,
                                            args.wrk_connections, args.wrk_duration)
                    print(f"[{config.name}] wrk: {record['wrk']['ok_per_s']:,.1f} ok req/s", flush=True)
                except Exception as error:
                    record["wrk"] = {"error": str(error)}
    except Exception as error:
        message = f"{type(error).__name__}: {error}"
        record["error"] = message.splitlines()[0]
        record["log_tail"] = server.log_tail()
        print(f"[{config.name}] error: {message}", flush=True)
    finally:
        if clocks is not None:
            clocks.__exit__(None, None, None)
        record["exit_status"] = server.stop()
    return record


def _with_image_extra(workload: Workload, config: ServerConfig) -> Workload:
    def patched(request: Request) -> Request:
        body = json.loads(request.body)
        if any(str(item).startswith("data:image/") for item in body["input"]):
            body.update(config.image_json_extra)
        return Request(request.path, json.dumps(body).encode(), request.content_type, request.items)

    return Workload(workload.name, workload.description, [patched(r) for r in workload.requests], workload.weights)


def _distinct_kinds(workload: Workload) -> List[Request]:
    """One request of each (path, item count) in the workload: what the check sends before the curve."""
    seen: Dict[Any, Request] = {}
    for request in workload.requests:
        seen.setdefault((request.path, request.content_type, request.items), request)
    return list(seen.values())


# ----- main --------------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    started, began = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    names = [name.strip() for group in args.configs.split(",") for name in CONFIG_GROUPS.get(group.strip(), group)
             .split(",") if name.strip()]
    folder, logs = args.results, args.results / "logs"
    results = load_results(folder)
    results["settings"] = {"p99_target_ms": args.p99_ms, "max_error_fraction": args.max_error_fraction,
                           "duration_s": args.duration, "warmup_s": args.warmup, "processes": args.processes,
                           "connections_per_process": args.connections, "client": args.client}
    raise_open_files_limit()  # for the client processes and wrk
    results["environment"] = {}  # this run's (an earlier command's may have been on another machine)
    if "encoder" not in names:  # otherwise the encoder's process records it
        results["environment"] = environment(args, logs)
    command = "python " + shlex.join([str(Path(sys.argv[0]).resolve().relative_to(REPO_ROOT))
                                      if Path(sys.argv[0]).resolve().is_relative_to(REPO_ROOT) else sys.argv[0],
                                      *(argv if argv is not None else sys.argv[1:])])
    jpegs = request_jpegs(args.photos, count=8)
    captions = request_captions(4096)
    results["inputs"] = {"jpegs": [{"bytes": len(jpeg), "sha256": hashlib.sha256(jpeg).hexdigest()[:16]}
                                   for jpeg in jpegs],
                         "photos": str(args.photos) if args.photos else "scikit-image samples",
                         "captions": f"{len(captions)} web-style captions (benchmark harness web_captions, seed 0)"}
    save_results(folder, results, args.model, args.small_model)
    server_names = [name for name in names if name != "encoder"]
    infinity_dir = None
    with tempfile.TemporaryDirectory() as scratch:
        wrk_jpeg = Path(scratch) / "request.jpg"
        wrk_jpeg.write_bytes(jpegs[0])
        if "encoder" in names:
            models = [args.model] + ([args.small_model] if "clip_flash-small-gpu" in names else [])
            for model in models:
                print(f"[encoder] {model} {args.precision}", flush=True)
                try:
                    record = measure_encoder(args, model, logs)
                except Exception as error:
                    results.setdefault("encoder_errors", {})[model] = str(error)
                    print(f"[encoder] {model}: failed: {error}", flush=True)
                    continue
                results["encoder"][model] = record
                results["environment"] = {key: value for key, value in record.items() if key != "encoder"}
                rates = record["encoder"]["patched"]
                print(f"[encoder] {model}: {rates['images_per_s']:,.0f} img/s, {rates['captions_per_s']:,.0f} "
                      "captions/s (patched)", flush=True)
                save_results(folder, results, args.model, args.small_model)
        if "infinity" in server_names and infinity_available(args.infinity_site) is None:
            infinity_dir = Path(scratch) / "hf-clip"
            python_subprocess(["-m", "benchmarks.serve.hf_clip_folder", "--model", args.model, "--out",
                               str(infinity_dir)], logs / "hf-clip-folder.log", timeout_s=600,
                              extra_path=args.infinity_site)
        configs = build_configs(server_names, args.model, args.small_model, args.precision, args.device,
                                shlex.split(args.server_args), args.stub_workers, infinity_dir, args.infinity_site,
                                args.infinity_batch)
        for config in configs:
            results["configs"][config.name] = run_config(args, config, jpegs, captions, wrk_jpeg, logs)
            save_results(folder, results, args.model, args.small_model)
    if not results.get("environment"):
        results["environment"] = environment(args, logs)
    results["runs"].append({"command": command, "started": started.isoformat(timespec="seconds"),
                            "elapsed_s": round(time.monotonic() - began, 1), "configs": names,
                            "device_name": results["environment"].get("device_name"),
                            "git_revision": results["environment"].get("git_revision")})
    save_results(folder, results, args.model, args.small_model)
    print(f"results: {folder / RESULTS_JSON}, {folder / RESULTS_MD} ({time.monotonic() - began:.0f} s)")
    for target in results["targets"]:
        print(f"  {'met' if target['met'] else 'NOT met' if target['met'] is False else 'not measured':>12}: "
              f"{target['target']}: {target['measured'] or target['note']} (required {target['required']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
