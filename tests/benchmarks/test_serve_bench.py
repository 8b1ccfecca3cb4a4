"""The serve bench on the CPU: its load generator against a model-less stub server with known delays and
failures (open loop: latency counted from the scheduled send time; errors by status; curves stop past the
target), and its driver end to end, writing the results files. The operator's baseline server with a real
model is the slow test at the end."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks.serve import bench_serve
from benchmarks.serve.curves import CurvePlan, run_curve
from benchmarks.serve.load_generator import LoadSettings, run_point
from benchmarks.serve.report import check_targets
from benchmarks.serve.workloads import build_workloads

REPO_ROOT = Path(__file__).resolve().parents[2]
SETTINGS = LoadSettings(processes=2, duration_s=1.5, warmup_s=0.3)


@contextmanager
def stub_server(*flags: str):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.serve.stub_server", "--port", str(port), *flags],
                               cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/ready", timeout=1)
                break
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def caption_workload():
    return build_workloads("stub", [b"\xff\xd8 not decoded by the stub"], ["a photo of a cat"] * 8,
                           names=["caption"])["caption"]


def test_latency_counts_from_the_scheduled_time_when_the_server_queues():
    # One request at a time, 50 ms each: 20 req/s at most. Offered 40 req/s, the queue grows for the whole
    # window, so requests wait far longer than the 50 ms a closed-loop client would see.
    with stub_server("--delay-ms", "50", "--serial") as url:
        light = run_point(url, caption_workload(), 5.0, SETTINGS)
        heavy = run_point(url, caption_workload(), 40.0, SETTINGS)
    assert light.error_count == 0 and light.ok == light.scheduled > 0
    assert 50.0 <= light.latency_ms(50) < 110.0
    assert heavy.latency_ms(99) > 400.0
    assert heavy.achieved_rps < 25.0  # the server's capacity, not the offer
    assert 40.0 * 0.6 < heavy.arrival_rps < 40.0 * 1.4  # Poisson arrivals at the offered rate kept coming


@pytest.mark.slow
def test_errors_are_counted_by_status_and_fail_the_point():
    with stub_server("--fail-every", "4", "--fail-status", "503") as url:
        point = run_point(url, caption_workload(), 60.0, SETTINGS)
        curve = run_curve("stub", url, caption_workload(), CurvePlan(rates=[60.0]), SETTINGS)
    assert set(point.errors) == {"503"}
    assert 0.15 < point.errors["503"] / point.scheduled < 0.35
    assert point.ok + point.error_count == point.scheduled
    assert point.error_count > curve.plan.max_error_fraction * point.scheduled
    assert not curve.meets(curve.points[0]) and curve.best is None  # fast or not, failures fail the point


@pytest.mark.slow
def test_rising_rates_stop_past_the_target_and_report_the_best_point():
    # Serial 5 ms requests: at most 200 req/s. Rates grow 4x from 12.5 until p99 passes 100 ms, then bisect.
    with stub_server("--delay-ms", "5", "--serial") as url:
        curve = run_curve("stub", url, caption_workload(),
                          CurvePlan(start_rps=12.5, factor=4.0, refine_steps=1, max_rps=5000.0, min_requests=0),
                          SETTINGS)
    offered = [point.offered_rps for point in curve.points]
    first_missed = next(index for index, point in enumerate(curve.points) if not curve.meets(point))
    assert first_missed >= 1 and offered[:first_missed + 1] == [12.5 * 4 ** k for k in range(first_missed + 1)]
    assert offered[first_missed] <= 800.0  # it stopped once past the server's capacity
    assert curve.points[first_missed].latency_ms(99) > 100.0
    assert len(offered) == first_missed + 2  # one bisection step, between the last met and the first missed
    assert abs(offered[-1] - offered[first_missed] / 2) < 1e-9  # sqrt(x/4 * x) = x/2
    best = curve.best
    assert best is not None and curve.meets(best) and best.achieved_rps < 205.0
    summary = curve.to_dict()
    assert summary["throughput_at_target"]["offered_rps"] == round(best.offered_rps, 2)


@pytest.mark.slow
def test_a_first_rate_past_capacity_searches_down():
    # Serial 20 ms requests: at most 50 req/s. Starting at 200 req/s, rates shrink 4x until one meets p99.
    with stub_server("--delay-ms", "20", "--serial") as url:
        curve = run_curve("stub", url, caption_workload(),
                          CurvePlan(start_rps=200.0, factor=4.0, refine_steps=1, min_requests=0), SETTINGS)
    offered = [point.offered_rps for point in curve.points]
    assert offered[:2] == [200.0, 50.0] and not curve.meets(curve.points[0])
    best = curve.best
    assert best is not None and best.offered_rps < 50.0
    assert offered[2] == 12.5 and curve.meets(curve.points[2])  # 50/s is the capacity: it queues without bound
    assert len(offered) == 4 and abs(offered[3] - 25.0) < 1e-9  # one bisection between 12.5 (met) and 50


@pytest.mark.slow
def test_driver_writes_results_against_the_stub(tmp_path):
    results = tmp_path / "results"
    status = bench_serve.main([
        "--configs", "stub", "--device", "cpu", "--workloads", "caption,image-raw,captions64", "--rates", "20,40",
        "--duration", "1", "--warmup", "0.3", "--min-requests", "0", "--processes", "2", "--stub-workers", "1",
        "--no-wrk",
        "--results", str(results)])
    assert status == 0
    record = json.loads((results / "serve_bench.json").read_text())
    stub = record["configs"]["stub"]
    assert stub.get("error") is None and stub["ready_after_s"] > 0
    assert set(stub["curves"]) == {"caption", "image-raw"}  # the stub config offers no 64-caption curve
    for curve in stub["curves"].values():
        assert [point["offered_rps"] for point in curve["points"]] == [20.0, 40.0]
        for point in curve["points"]:
            assert point["ok"] > 0 and point["errors"] == {} and point["meets_target"]
            assert 0 < point["latency_ms"]["p50"] <= point["latency_ms"]["p99"] <= point["latency_ms"]["p99.9"]
        assert curve["throughput_at_target"]["offered_rps"] == 40.0
    assert record["environment"]["git_revision"] and record["runs"][0]["configs"] == ["stub"]
    assert len(record["inputs"]["jpegs"]) >= 1
    assert all(target["met"] is None for target in record["targets"])  # no clip_flash server was run
    markdown = (results / "serve_bench.md").read_text()
    assert "## stub" in markdown and "| 40.0 |" in markdown
    assert (results / "logs" / "stub.log").exists()


def test_targets_compare_the_curves_with_the_encoder():
    def curve(rps, items=None, points=()):
        return {"throughput_at_target": {"requests_per_s": rps, "items_per_s": items or rps}, "points": list(points)}

    at_50 = {"offered_rps": 50.0, "latency_ms": {"p50": 4.0, "p99": 13.0}, "errors": {}}
    results = {
        "encoder": {"ViT-L-14": {"encoder": {"patched": {"images_per_s": 2600.0}}}},
        "configs": {
            "clip_flash": {"curves": {"image-raw": curve(2300.0, points=[at_50]), "caption": curve(12000.0),
                                      "captions64": curve(1000.0, 64000.0)}},
            "operator": {"curves": {"image-raw": curve(200.0)}},
        },
    }
    met = {target["target"]: target["met"] for target in check_targets(results, "ViT-L-14", "ViT-B-32")}
    assert met["ViT-L-14, one JPEG a request (raw bytes), throughput at p99 <= 100 ms"] is True  # 2300 >= 2210
    assert met["ViT-L-14, one JPEG a request at 50 req/s, client's clock"] is False  # p99 13 > 12
    assert met["ViT-L-14, one caption a request"] is True
    assert met["ViT-L-14, 64 captions a request"] is False
    assert met["ViT-L-14, one JPEG a request, over the first baseline (operator's server)"] is True  # 11.5x
    assert met["ViT-B-32 --decode gpu, one JPEG a request"] is None


@pytest.mark.slow
def test_driver_against_the_operator_baseline_with_a_real_model(tmp_path):
    results = tmp_path / "results"
    status = bench_serve.main([
        "--configs", "operator", "--device", "cpu", "--precision", "fp32", "--model", "ViT-B-32",
        "--workloads", "caption,image-raw", "--rates", "2", "--duration", "1.5", "--warmup", "0.3",
        "--min-requests", "0",
        "--processes", "1", "--no-wrk", "--timeout", "60", "--results", str(results)])
    assert status == 0
    operator = json.loads((results / "serve_bench.json").read_text())["configs"]["operator"]
    assert operator.get("error") is None and operator["workload_errors"] == {}
    for name in ("caption", "image-raw"):
        point = operator["curves"][name]["points"][0]
        assert point["ok"] > 0 and point["errors"] == {}


def test_a_points_slow_requests_are_located_in_the_servers_stages():
    """Between two reads of a server's /metrics, the share of requests and of each stage's observations past a
    bucket bound under the client's p99; the report sets them beside the client's share."""
    from benchmarks.serve import server_metrics
    from benchmarks.serve.load_generator import PointResult
    from benchmarks.serve.report import _tail_table
    from clip_flash.serve.metrics import ServeMetrics

    route = "/v1/embeddings/image"
    metrics = ServeMetrics(lambda tower: 0)
    metrics.answered(route, 200, 0.2)  # before the point: not counted in it
    before = server_metrics.parse(metrics.render().decode())
    for seconds in [0.003] * 96 + [0.03] * 4:  # 4 of 100 requests past 25 ms on the server's clock
        metrics.answered(route, 200, seconds, answer_seconds=0.0002)
    metrics.batch("image", 8, 0.002)
    metrics.batch("image", 8, 0.04)  # one of two batches prepared past 25 ms
    metrics.encoded("image", 0.002)
    metrics.queued("image", [0.001] * 16)
    after = server_metrics.parse(metrics.render().decode())

    point = PointResult(offered_rps=50.0)
    for milliseconds in [3.5] * 94 + [32.0] * 6:  # the client's clock: 6 of 100 past 25 ms, p99 32 ms
        point.latency.record_value(int(milliseconds * 1000))
    assert point.share_slower_than(25.0) == pytest.approx(0.06)
    bound = server_metrics.tail_bound(point.latency_ms(99), server_metrics.bucket_bounds(after))
    assert bound == 0.025
    shares = server_metrics.shares_past(before, after, bound)
    assert shares["request"][route] == {"share": 0.04, "count": 100}
    assert shares["prepare (per batch)"]["image"] == {"share": 0.5, "count": 2}
    assert shares["encode (per batch)"]["image"]["share"] == 0.0
    assert shares["queued"]["image"] == {"share": 0.0, "count": 16}
    assert shares["answer"][route]["share"] == 0.0
    assert server_metrics.curve_means(before, after)["image"]["mean batch"] == 8.0

    intervals = server_metrics.p99_intervals(before, after)
    assert intervals["request"][route] == (0.025, 0.05) and intervals["queued"]["image"] == (0.0005, 0.001)
    assert intervals["prepare (per batch)"]["image"] == (0.025, 0.05)

    row = {"offered_rps": 50.0, "server_tail": {"bound_ms": 25.0, "client_share": 0.06, "server": shares,
                                                "server_p99_s": intervals}}
    table = "\n".join(_tail_table([row]))
    assert "| 50.0 | 25 | 6.00% | 4.00% | 0.5-1 | 25-50 | 1-2.5 | 0.1-0.25 |" in table
    assert server_metrics.tail_bound(0.5, server_metrics.bucket_bounds(after)) is None  # under 1 ms: none


def test_the_gpus_clocks_are_reported_per_point_with_or_without_a_tail():
    from benchmarks.serve.report import _clock_lines, _tail_table

    clocks = {"samples": 160, "sm_mhz_median": 1755.0, "sm_mhz_min": 1650.0, "sm_mhz_max": 1980.0,
              "mem_mhz_median": 3201.0, "power_w_median": 690.0, "power_w_max": 702.0, "temperature_c_max": 66.0,
              "event_reasons": ["idle", "software power cap"]}
    points = [{"offered_rps": 1500.0, "server_tail": {"gpu_clocks": clocks}},  # /metrics gave no bound here
              {"offered_rps": 1580.0}]
    assert _tail_table(points) == []
    line = "\n".join(_clock_lines(points))
    assert "1,500 req/s: SM 1755 MHz (1650-1980), 690 W (max 702); below max: software power cap" in line
    assert "1,580" not in line and _clock_lines([{"offered_rps": 50.0}]) == []


def test_sends_wait_for_their_time_and_spin_only_at_low_rates():
    """A send never leaves before its scheduled time (sleep, then a spin that yields to the loop); processes
    offered more than SPIN_MAX_RATE requests/s only sleep (spinning would take their core for the whole point)."""
    import asyncio

    from benchmarks.serve import load_generator

    assert load_generator._spin_seconds(load_generator.SPIN_MAX_RATE) == load_generator.SPIN_S
    assert load_generator._spin_seconds(load_generator.SPIN_MAX_RATE * 2) == 0.0

    async def late_by() -> list:
        out = []
        for offset in (0.0005, 0.003, -0.001):  # within the spin, past it, already due
            when = time.monotonic() + offset
            await load_generator._wait_until(when, load_generator.SPIN_S)
            out.append(time.monotonic() - when)
        return out

    assert all(late >= 0 for late in asyncio.run(late_by()))
