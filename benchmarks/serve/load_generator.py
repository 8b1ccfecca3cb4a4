"""Open-loop HTTP load: Poisson arrivals at a set rate from several client processes, HDR percentiles.

Why it is built this way:
- Open loop. Each client process draws its arrival times in advance (exponential gaps at its share of the
  rate) and sends every request at its scheduled time whether or not earlier ones have been answered, as
  independent users do. A closed loop (send, wait, send) slows down with the server and hides its queueing.
- No coordinated omission. A request's latency is measured from its *scheduled* send time, on the client's
  monotonic clock, to the last byte of its response. If the client itself falls behind (its event loop busy,
  its connection pool full), the delay is charged to the request, not forgotten; how far behind the client
  was is reported separately (``send_lag``), so a point limited by the generator can be told apart.
- Sends on time. An event loop's timers count whole milliseconds, so a sleep to a send time wakes up to a
  millisecond late, and that lateness would be charged to the server; at low per-process rates the last
  1.5 ms before each send is a spin that yields to the loop (``_wait_until``).
- Several processes, one event loop each (uvloop when installed), aiohttp clients: one Python process tops
  out at a few thousand requests a second, so the rate is split across processes. Their HDR histograms are
  encoded, sent back and merged, so percentiles are exact to the histogram's 3 significant digits.
- Warm-up. Requests scheduled in the first ``warmup_s`` are sent but not counted (connections opening,
  caches filling); only requests scheduled in the measured window are in the results.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import random
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import aiohttp
from hdrh.histogram import HdrHistogram

try:  # imported here, before the client processes fork, so no arrival waits for an import
    import uvloop
except ImportError:
    uvloop = None

# Latencies are kept in microseconds, from 1 us to 120 s, to 3 significant digits.
HISTOGRAM_RANGE_US = (1, 120_000_000)
HISTOGRAM_DIGITS = 3
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def new_histogram() -> HdrHistogram:
    return HdrHistogram(*HISTOGRAM_RANGE_US, HISTOGRAM_DIGITS)


@dataclass(frozen=True)
class Request:
    """One request body ready to send: where, what, and how many embeddings it asks for."""

    path: str
    body: bytes
    content_type: str
    items: int


@dataclass(frozen=True)
class Workload:
    """A named set of requests; each arrival sends one of them, drawn at random (with ``weights``, if any)."""

    name: str
    description: str
    requests: Sequence[Request]
    weights: Optional[Sequence[float]] = None


@dataclass(frozen=True)
class LoadSettings:
    """How one point of a curve is driven."""

    processes: int = 4
    duration_s: float = 3.0
    warmup_s: float = 0.5
    connections_per_process: int = 256
    request_timeout_s: float = 30.0
    client: str = "aiohttp"  # or "httpx" (slower per request; kept to measure the difference)


@dataclass
class PointResult:
    """Merged outcome of one rate: percentiles of successful requests, achieved rate, errors by kind."""

    offered_rps: float
    scheduled: int = 0  # requests scheduled in the measured window
    ok: int = 0
    ok_items: int = 0
    errors: Dict[str, int] = field(default_factory=dict)  # HTTP status or failure kind -> count
    window_s: float = 0.0
    drain_s: float = 0.0  # from the window's end until its last request was answered
    generator_cpu_s: float = 0.0  # CPU time (user + system) of the client processes, warm-up included
    sent: int = 0  # requests sent, warm-up included
    latency: HdrHistogram = field(default_factory=new_histogram)
    send_lag: HdrHistogram = field(default_factory=new_histogram)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def arrival_rps(self) -> float:
        """Requests actually scheduled per second in the window (Poisson: close to, not exactly, the offer)."""
        return self.scheduled / self.window_s if self.window_s else 0.0

    @property
    def achieved_rps(self) -> float:
        """The window's successful requests per second, over the window plus the time its backlog took to be
        answered (``drain_s``): the arrival rate when the server keeps up, its capacity when it does not."""
        return self.ok / (self.window_s + self.drain_s) if self.window_s else 0.0

    @property
    def achieved_items_per_s(self) -> float:
        return self.ok_items / (self.window_s + self.drain_s) if self.window_s else 0.0

    def latency_ms(self, percentile: float) -> Optional[float]:
        if self.latency.get_total_count() == 0:
            return None
        return self.latency.get_value_at_percentile(percentile) / 1000.0

    def share_slower_than(self, milliseconds: float) -> Optional[float]:
        """The share of successful requests whose latency passed ``milliseconds`` (HDR precision)."""
        total = self.latency.get_total_count()
        if total == 0:
            return None
        bound_us = milliseconds * 1000.0
        slower = sum(item.count_at_value_iterated_to for item in self.latency.get_recorded_iterator()
                     if item.value_iterated_to > bound_us)
        return slower / total

    def to_dict(self) -> Dict[str, object]:
        def ms(histogram: HdrHistogram, q: float) -> Optional[float]:
            return histogram.get_value_at_percentile(q) / 1000.0 if histogram.get_total_count() else None

        return {
            "offered_rps": round(self.offered_rps, 2),
            "scheduled": self.scheduled,
            "arrival_rps": round(self.arrival_rps, 2),
            "ok": self.ok,
            "achieved_rps": round(self.achieved_rps, 2),
            "achieved_items_per_s": round(self.achieved_items_per_s, 2),
            "errors": dict(sorted(self.errors.items())),
            "window_s": round(self.window_s, 3),
            "drain_s": round(self.drain_s, 3),
            "generator_cpu_us_per_request": round(1e6 * self.generator_cpu_s / self.sent, 1) if self.sent else None,
            "latency_ms": {f"p{q:g}": ms(self.latency, q) for q in PERCENTILES}
            | {"mean": (self.latency.get_mean_value() / 1000.0) if self.ok else None,
               "max": (self.latency.get_max_value() / 1000.0) if self.ok else None},
            "send_lag_ms": {f"p{q:g}": ms(self.send_lag, q) for q in (50.0, 99.0)}
            | {"max": self.send_lag.get_max_value() / 1000.0 if self.send_lag.get_total_count() else None},
        }


# ----- one client process -------------------------------------------------------------------------------------
def _arrival_times(rate: float, start: float, end: float, seed: int) -> List[float]:
    """Poisson arrivals (exponential gaps) at ``rate`` per second in [start, end), on the monotonic clock."""
    rng = random.Random(seed)
    times, t = [], start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return times
        times.append(t)


class _Tally:
    """Outcomes of one client process. The hot path only appends; histograms are filled after the last
    response (recording into an HDR histogram in Python costs tens of microseconds a value)."""

    def __init__(self, window_start: float, window_end: float) -> None:
        self.window_start, self.window_end = window_start, window_end
        self.outcomes: List[tuple] = []

    def record(self, scheduled: float, sent: float, done: float, outcome: str, items: int) -> None:
        self.outcomes.append((scheduled, sent, done, outcome, items))

    def summary(self) -> Dict[str, object]:
        latency, send_lag, errors = new_histogram(), new_histogram(), Counter()
        scheduled = ok = ok_items = 0
        last_done = 0.0
        for when, sent, done, outcome, items in self.outcomes:
            if when < self.window_start:
                continue
            scheduled += 1
            last_done = max(last_done, done)
            send_lag.record_value(max(1, int((sent - when) * 1e6)))
            if outcome == "200":
                ok += 1
                ok_items += items
                latency.record_value(max(1, min(int((done - when) * 1e6), HISTOGRAM_RANGE_US[1])))
            else:
                errors[outcome] += 1
        return {"latency": latency.encode(), "send_lag": send_lag.encode(), "errors": dict(errors),
                "scheduled": scheduled, "ok": ok, "ok_items": ok_items, "last_done": last_done,
                "sent": len(self.outcomes)}


async def _run_client(base_url: str, workload: Workload, arrivals: List[float], window_start: float,
                      window_end: float, settings: LoadSettings, seed: int) -> _Tally:
    tally = _Tally(window_start, window_end)
    rng = random.Random(seed + 1)
    requests = list(workload.requests)
    choices = (rng.choices(requests, weights=workload.weights, k=len(arrivals)) if workload.weights
               else [requests[rng.randrange(len(requests))] for _ in arrivals])
    send = await _sender(base_url, settings)
    tasks = []

    async def one(scheduled: float, request: Request) -> None:
        sent = time.monotonic()
        outcome = await send.post(request)
        tally.record(scheduled, sent, time.monotonic(), outcome, request.items)

    loop = asyncio.get_running_loop()
    spin = _spin_seconds(len(arrivals) / max(window_end - arrivals[0], 1e-9) if arrivals else 0.0)
    for scheduled, request in zip(arrivals, choices):
        await _wait_until(scheduled, spin)
        tasks.append(loop.create_task(one(scheduled, request)))
    if tasks:
        await asyncio.gather(*tasks)
    await send.close()
    return tally


# The event loop's timers count whole milliseconds (uvloop's, and asyncio's epoll timeout): a sleep to a send time
# wakes up to a millisecond off it, and that lateness is charged to the request (0.31-0.36 ms at p50 against a
# model-less stub at 50 req/s). So the last SPIN_S before a send is a spin that yields to the loop at every turn
# (responses are still read as they come); it costs CPU only at low rates, where cores are idle anyway: a
# process offered more than SPIN_MAX_RATE requests/s sleeps as before (it would spin most of the time).
SPIN_S = 0.0015
SPIN_MAX_RATE = 100.0


def _spin_seconds(rate_per_process: float) -> float:
    return SPIN_S if rate_per_process <= SPIN_MAX_RATE else 0.0


async def _wait_until(when: float, spin: float) -> None:
    """Return at ``when`` on the monotonic clock: a sleep to ``spin`` seconds before it, then a yielding spin."""
    delay = when - time.monotonic() - spin
    if delay > 0:
        await asyncio.sleep(delay)
    while spin and time.monotonic() < when:
        await asyncio.sleep(0)


async def _sender(base_url: str, settings: LoadSettings):
    if settings.client == "aiohttp":
        return _AiohttpSender(base_url, settings)
    if settings.client == "httpx":
        return _HttpxSender(base_url, settings)
    raise ValueError(f"unknown client {settings.client!r} (aiohttp or httpx)")


class _AiohttpSender:
    def __init__(self, base_url: str, settings: LoadSettings) -> None:
        self.base_url = base_url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=settings.connections_per_process, force_close=False),
            timeout=aiohttp.ClientTimeout(total=settings.request_timeout_s),
            skip_auto_headers=("User-Agent",),
        )

    async def post(self, request: Request) -> str:
        try:
            async with self.session.post(self.base_url + request.path, data=request.body,
                                         headers={"Content-Type": request.content_type}) as response:
                await response.read()
                return str(response.status)
        except asyncio.TimeoutError:
            return "timeout"
        except aiohttp.ClientConnectionError as error:
            return f"connection:{type(error).__name__}"
        except Exception as error:  # anything else is counted, never fatal to the other requests
            return f"client:{type(error).__name__}"

    async def close(self) -> None:
        await self.session.close()


class _HttpxSender:
    def __init__(self, base_url: str, settings: LoadSettings) -> None:
        import httpx

        self._httpx = httpx
        self.client = httpx.AsyncClient(
            base_url=base_url, timeout=settings.request_timeout_s,
            limits=httpx.Limits(max_connections=settings.connections_per_process,
                                max_keepalive_connections=settings.connections_per_process),
        )

    async def post(self, request: Request) -> str:
        try:
            response = await self.client.post(request.path, content=request.body,
                                              headers={"Content-Type": request.content_type})
            return str(response.status_code)
        except self._httpx.TimeoutException:
            return "timeout"
        except self._httpx.TransportError as error:
            return f"connection:{type(error).__name__}"
        except Exception as error:
            return f"client:{type(error).__name__}"

    async def close(self) -> None:
        await self.client.aclose()


def _client_process(base_url: str, workload: Workload, rate: float, start: float, window_start: float,
                    end: float, settings: LoadSettings, seed: int, results: multiprocessing.Queue) -> None:
    import gc

    gc.freeze()  # what the fork inherited stays out of this process's collections (no pause mid-point)
    run = uvloop.run if uvloop is not None else asyncio.run
    arrivals = _arrival_times(rate, start, end, seed)
    try:
        tally = run(_run_client(base_url, workload, arrivals, window_start, end, settings, seed))
        results.put(tally.summary())
    except BaseException as error:  # report, so the parent never waits forever for this process
        results.put({"failed": f"{type(error).__name__}: {error}"})


# ----- one point: several processes at one total rate ---------------------------------------------------------
def run_point(base_url: str, workload: Workload, rate: float, settings: LoadSettings, seed: int = 0) -> PointResult:
    """Offer ``rate`` requests/s of ``workload`` to ``base_url`` for ``settings.duration_s`` (after warm-up)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    context = multiprocessing.get_context("fork")  # the workload's bodies are shared, not pickled
    results = context.Queue()
    processes = max(1, min(settings.processes, int(rate) or 1))
    start = time.monotonic() + 0.3  # time for every process to be up before the first arrival
    window_start = start + settings.warmup_s
    end = window_start + settings.duration_s
    workers = [
        context.Process(target=_client_process, daemon=True,
                        args=(base_url, workload, rate / processes, start, window_start, end, settings,
                              seed * 1000 + index, results))
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    point = PointResult(offered_rps=rate, window_s=settings.duration_s)
    failures, last_done = [], 0.0
    deadline = end + settings.request_timeout_s + 30.0
    for _ in workers:
        message = results.get(timeout=max(1.0, deadline - time.monotonic()))
        if "failed" in message:
            failures.append(message["failed"])
            continue
        point.latency.add(HdrHistogram.decode(message["latency"]))
        point.send_lag.add(HdrHistogram.decode(message["send_lag"]))
        for kind, count in message["errors"].items():
            point.errors[kind] = point.errors.get(kind, 0) + count
        point.scheduled += message["scheduled"]
        point.ok += message["ok"]
        point.ok_items += message["ok_items"]
        point.sent += message["sent"]
        last_done = max(last_done, message["last_done"])
    for worker in workers:
        worker.join(timeout=10)
    if failures:
        raise RuntimeError(f"{len(failures)} load-generator process(es) failed: {failures[0]}")
    point.drain_s = max(0.0, last_done - end)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the joined client processes, reaped
    point.generator_cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return point
