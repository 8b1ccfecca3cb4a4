"""The server's Prometheus metrics (``GET /metrics``), in a registry of their own so that several servers (or
tests) in one process never collide.

Names follow the peers' in spirit (TEI's queue size and per-stage durations, Triton's queue and compute
durations): requests by route and status, items queued per tower, batch sizes, and the seconds each item spends
queued, each batch preparing and encoding, and each request being answered.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .jobs import TOWERS

# Seconds: from 100 us (a replayed graph) to 10 s (a loaded CPU).
SECONDS_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = CONTENT_TYPE_LATEST
VECTORIZE_FROM = 16  # waits in one call from which numpy bucketing beats observe() each (16: 13 us vs 19 us)


class ServeMetrics:
    """Counters, gauges and histograms of one server; ``render()`` is the /metrics body."""

    def __init__(self, queue_depth: Callable[[str], int]) -> None:
        """``queue_depth(tower)``: read at each scrape (no cost per request)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("clip_flash_requests", "HTTP requests answered, by route and status code",
                                ["route", "status"], registry=r)
        self.items = Counter("clip_flash_items", "Inputs answered, by tower and outcome (ok, error)",
                             ["tower", "outcome"], registry=r)
        self.dropped_items = Counter("clip_flash_items_dropped", "Queued inputs dropped before compute because "
                                     "their client went away or their deadline passed", ["tower"],
                                     registry=r)
        depth = Gauge("clip_flash_queue_depth", "Inputs waiting in the queue, per tower", ["tower"],
                      registry=r)
        for tower in TOWERS:
            depth.labels(tower).set_function(lambda tower=tower: queue_depth(tower))
        self.batch_size = Histogram("clip_flash_batch_size", "Inputs per batch, per tower", ["tower"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.queue_seconds = Histogram("clip_flash_queue_seconds", "Seconds a request's inputs waited in the "
                                       "queue (one observation per request and tower)", ["tower"],
                                       buckets=SECONDS_BUCKETS, registry=r)
        self.prepare_seconds = Histogram("clip_flash_prepare_seconds", "Seconds preparing a batch's inputs "
                                         "(decoding, resampling, tokenizing)", ["tower"], buckets=SECONDS_BUCKETS,
                                         registry=r)
        self.encode_seconds = Histogram("clip_flash_encode_seconds", "Seconds from a prepared batch to its "
                                        "embeddings on the host", ["tower"], buckets=SECONDS_BUCKETS,
                                        registry=r)
        self.answer_seconds = Histogram("clip_flash_answer_seconds", "Seconds from a request's last result to its "
                                        "response body", ["route"], buckets=SECONDS_BUCKETS, registry=r)
        self.request_seconds = Histogram("clip_flash_request_seconds", "Seconds from a request's arrival to its "
                                         "response body", ["route"], buckets=SECONDS_BUCKETS, registry=r)
        self._request_children: Dict[Tuple[str, int], Tuple[Any, Any, Any]] = {}
        self._tower = {tower: (self.batch_size.labels(tower), self.queue_seconds.labels(tower),
                               self.prepare_seconds.labels(tower), self.encode_seconds.labels(tower),
                               self.dropped_items.labels(tower), self.items.labels(tower, "ok"),
                               self.items.labels(tower, "error")) for tower in TOWERS}

    # -- from the HTTP side ----------------------------------------------------------------------------------------
    def _children(self, route: str, status: int) -> Tuple[Any, Any, Any]:
        children = self._request_children.get((route, status))
        if children is None:  # labels() costs a lock and a dict lookup: once per (route, status)
            children = self._request_children[(route, status)] = (
                self.requests.labels(route, str(status)), self.request_seconds.labels(route),
                self.answer_seconds.labels(route))
        return children

    def answered(self, route: str, status: int, seconds: Optional[float] = None,
                 answer_seconds: Optional[float] = None) -> None:
        children = self._children(route, status)
        children[0].inc()
        if seconds is not None:
            children[1].observe(seconds)
        if answer_seconds is not None:
            children[2].observe(answer_seconds)

    def outcomes(self, tower: str, ok: int, errors: int) -> None:
        children = self._tower[tower]
        if ok:
            children[5].inc(ok)
        if errors:
            children[6].inc(errors)

    # -- from the batchers -----------------------------------------------------------------------------------------
    def queued(self, tower: str, waits: Sequence[float]) -> None:
        histogram = self._tower[tower][1]
        if len(waits) < VECTORIZE_FROM:
            for seconds in waits:
                histogram.observe(seconds)
            return
        import numpy as np  # a batch of many requests: bucket them in one call, add O(buckets)

        values = np.asarray(waits, dtype=np.float64)
        counts = np.bincount(np.searchsorted(SECONDS_BUCKETS, values, side="left"),
                             minlength=len(SECONDS_BUCKETS) + 1)
        _add_observations(histogram, counts.tolist(), float(values.sum()))

    def batch(self, tower: str, size: int, prepare_seconds: float) -> None:
        children = self._tower[tower]
        children[0].observe(size)
        children[2].observe(prepare_seconds)

    def encoded(self, tower: str, seconds: float) -> None:
        self._tower[tower][3].observe(seconds)

    def dropped(self, tower: str, count: int) -> None:
        self._tower[tower][4].inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def apply(self, relayed: "RelayedMetrics.Observations") -> None:
        """Add a frontend's aggregated observations (``RelayedMetrics.take()``): work per (route, status),
        route and bucket, none per request."""
        answered, request_seconds, answer_seconds, outcomes = relayed
        for (route, status), count in answered.items():
            children = self._children(route, status)
            children[0].inc(count)
        for route, (counts, total) in request_seconds.items():
            _add_observations(self.request_seconds.labels(route), counts, total)
        for route, (counts, total) in answer_seconds.items():
            _add_observations(self.answer_seconds.labels(route), counts, total)
        for tower, (ok, errors) in outcomes.items():
            self.outcomes(tower, ok, errors)


def _add_observations(histogram: Any, counts: Sequence[int], total: float) -> None:
    """Add ``counts[i]`` observations in bucket ``i`` (``SECONDS_BUCKETS`` then +Inf) summing to ``total`` to
    a labelled Histogram: what ``observe`` does for each, in O(buckets). prometheus_client has no public call
    for it, so this uses the child's ``_buckets``/``_sum`` values (the same ones ``observe`` increments)."""
    buckets = histogram._buckets
    if len(buckets) != len(counts):
        raise ValueError(f"{len(counts)} bucket counts for a histogram of {len(buckets)} buckets")
    for bucket, count in zip(buckets, counts):
        if count:
            bucket.inc(count)
    histogram._sum.inc(total)


class RelayedMetrics:
    """A frontend's half of the metrics with ``--workers N``: it aggregates what the routes observe (counts
    per route and status, histogram bucket counts and sums per route, outcomes per tower) and hands that to the
    engine process (``take``), whose one registry /metrics shows, so counts cover every frontend."""

    Observations = Tuple[Dict[Tuple[str, int], int], Dict[str, Tuple[List[int], float]],
                         Dict[str, Tuple[List[int], float]], Dict[str, Tuple[int, int]]]

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._answered: Dict[Tuple[str, int], int] = {}
        self._request_seconds: Dict[str, List[Any]] = {}
        self._answer_seconds: Dict[str, List[Any]] = {}
        self._outcomes: Dict[str, List[int]] = {}

    def answered(self, route: str, status: int, seconds: Optional[float] = None,
                 answer_seconds: Optional[float] = None) -> None:
        key = (route, status)
        self._answered[key] = self._answered.get(key, 0) + 1
        if seconds is not None:
            _observe(self._request_seconds, route, seconds)
        if answer_seconds is not None:
            _observe(self._answer_seconds, route, answer_seconds)

    def outcomes(self, tower: str, ok: int, errors: int) -> None:
        counts = self._outcomes.get(tower)
        if counts is None:
            counts = self._outcomes[tower] = [0, 0]
        counts[0] += ok
        counts[1] += errors

    def take(self) -> "RelayedMetrics.Observations":
        taken = (self._answered, {route: (counts, total) for route, (counts, total) in self._request_seconds.items()},
                 {route: (counts, total) for route, (counts, total) in self._answer_seconds.items()},
                 {tower: (ok, errors) for tower, (ok, errors) in self._outcomes.items()})
        self._reset()
        return taken


def _observe(histograms: Dict[str, List[Any]], route: str, seconds: float) -> None:
    """One observation into an aggregated ``SECONDS_BUCKETS`` histogram: the bucket ``observe`` would pick
    (the first bound >= seconds; the last is +Inf)."""
    entry = histograms.get(route)
    if entry is None:
        entry = histograms[route] = [[0] * (len(SECONDS_BUCKETS) + 1), 0.0]
    entry[0][bisect_left(SECONDS_BUCKETS, seconds)] += 1
    entry[1] += seconds


def metric_families(text: str) -> Sequence[str]:
    """The metric family names in a /metrics body (for tests and tools)."""
    return sorted({line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")})


def merge_expositions(texts: Sequence[bytes]) -> bytes:
    """Several engine processes' /metrics bodies as one server's: every sample with the same name and labels
    summed (counts, histogram buckets and sums, queue depths), a ``_created`` time the earliest."""
    from prometheus_client.core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: Dict[str, Tuple[Any, Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            _, values = families.setdefault(family.name, (family, {}))
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    values[key] = sample.value
                elif sample.name.endswith("_created"):
                    values[key] = min(values[key], sample.value)
                else:
                    values[key] += sample.value

    class Merged:
        def collect(self):
            for family, values in families.values():
                merged = Metric(family.name, family.documentation, family.type)
                merged.samples = [Sample(name, dict(labels), value) for (name, labels), value in values.items()]
                yield merged

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Merged())
    return generate_latest(registry)
