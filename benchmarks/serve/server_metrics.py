"""What the server's own ``/metrics`` say about a curve and about each of its points.

Read before and after a curve; the difference of each histogram's sum and count gives the curve's means (the
batches it formed, how long they prepared and encoded, how long requests queued), which tell which stage bounds
a rate the curve could not pass. Read between points too: each point's slow requests are then located. The
client's share of requests slower than a histogram bound is set beside the server's own share past the same
bound (from arrival in the app to the response body) and each stage's: a tail the server's clock also sees
lives in the server (and its stages say where); one only the client sees lives outside it (HTTP parsing, the
network stack, the load generator). Servers without ``/metrics`` (the baselines) give nothing.
"""
from __future__ import annotations

import dataclasses
import math
import urllib.request
from typing import Dict, Optional, Sequence, Tuple

from prometheus_client.parser import text_string_to_metric_families

# family -> what the curve summary calls its mean
HISTOGRAMS = {"clip_flash_batch_size": "mean batch", "clip_flash_prepare_seconds": "mean prepare s",
              "clip_flash_encode_seconds": "mean encode s", "clip_flash_queue_seconds": "mean queued s"}
# family -> its name in a point's report (the share past a bound, the bucket of its p99)
STAGES = {"clip_flash_request_seconds": "request", "clip_flash_queue_seconds": "queued",
          "clip_flash_prepare_seconds": "prepare (per batch)", "clip_flash_encode_seconds": "encode (per batch)",
          "clip_flash_answer_seconds": "answer"}

Key = Tuple[str, str]  # (family, its tower or route label)


@dataclasses.dataclass
class Scrape:
    """One read of ``/metrics``: each histogram's (sum, count) and its cumulative bucket counts."""

    totals: Dict[Key, Tuple[float, float]]
    buckets: Dict[Key, Dict[float, float]]  # upper bound (s; inf last) -> observations at or under it


def parse(text: str) -> Optional[Scrape]:
    """The clip_flash histograms of a ``/metrics`` body (None when it has none)."""
    totals: Dict[Key, Tuple[float, float]] = {}
    buckets: Dict[Key, Dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in HISTOGRAMS and family.name not in STAGES:
            continue
        for sample in family.samples:
            key = (family.name, sample.labels.get("tower") or sample.labels.get("route", ""))
            total, count = totals.get(key, (0.0, 0.0))
            if sample.name.endswith("_sum"):
                totals[key] = (sample.value, count)
            elif sample.name.endswith("_count"):
                totals[key] = (total, sample.value)
            elif sample.name.endswith("_bucket"):
                buckets.setdefault(key, {})[float(sample.labels["le"])] = sample.value
    return Scrape(totals, buckets) if totals else None


def scrape(base_url: str, timeout: float = 10.0) -> Optional[Scrape]:
    """The server's histograms now, or None when it has no clip_flash metrics."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except Exception:  # noqa: BLE001 - a baseline without /metrics
        return None
    return parse(text)


def curve_means(before: Optional[Scrape], after: Optional[Scrape]) -> Dict[str, Dict[str, float]]:
    """Per tower, the mean of each histogram over what was observed between the two scrapes."""
    if before is None or after is None:
        return {}
    means: Dict[str, Dict[str, float]] = {}
    for (family, tower), (total, count) in after.totals.items():
        if family not in HISTOGRAMS:
            continue
        old_total, old_count = before.totals.get((family, tower), (0.0, 0.0))
        if count > old_count:
            means.setdefault(tower, {})[HISTOGRAMS[family]] = round((total - old_total) / (count - old_count), 6)
            if family == "clip_flash_batch_size":
                means[tower]["batches"] = count - old_count
    return means


def tail_bound(p99_ms: Optional[float], bounds_s: Sequence[float]) -> Optional[float]:
    """The histogram bound (s) the point's slow requests are counted past: the largest at or under the client's
    p99 (so the client's share past it is at least 1%), at least 1 ms."""
    if p99_ms is None:
        return None
    under = [bound for bound in bounds_s if 1e-3 <= bound <= p99_ms / 1e3 and math.isfinite(bound)]
    return max(under) if under else None


def shares_past(before: Optional[Scrape], after: Optional[Scrape], bound_s: float) -> Dict[str, Dict[str, float]]:
    """Per stage (``STAGES``' names) and label, the share of the observations made between the two scrapes
    that took longer than ``bound_s`` (which must be one of the histograms' bucket bounds), with their count."""
    if before is None or after is None:
        return {}
    shares: Dict[str, Dict[str, float]] = {}
    for (family, label), cumulative in after.buckets.items():
        if family not in STAGES or bound_s not in cumulative:
            continue
        old = before.buckets.get((family, label), {})
        count = cumulative[math.inf] - old.get(math.inf, 0.0)
        if count <= 0:
            continue
        past = count - (cumulative[bound_s] - old.get(bound_s, 0.0))
        shares.setdefault(STAGES[family], {})[label] = {"share": round(past / count, 5), "count": int(count)}
    return shares


def p99_intervals(before: Optional[Scrape], after: Optional[Scrape], percentile: float = 99.0
                  ) -> Dict[str, Dict[str, Tuple[float, float]]]:
    """Per stage and label, the bucket (lower, upper bound in s) holding the ``percentile``-th of the
    observations made between the two scrapes: a stage whose own p99 is short cannot hold a long tail alone."""
    if before is None or after is None:
        return {}
    intervals: Dict[str, Dict[str, Tuple[float, float]]] = {}
    for (family, label), cumulative in after.buckets.items():
        if family not in STAGES:
            continue
        old = before.buckets.get((family, label), {})
        count = cumulative[math.inf] - old.get(math.inf, 0.0)
        if count <= 0:
            continue
        lower = 0.0
        for bound in sorted(cumulative):
            if cumulative[bound] - old.get(bound, 0.0) >= count * percentile / 100.0:
                intervals.setdefault(STAGES[family], {})[label] = (lower, bound)
                break
            lower = bound
    return intervals


def bucket_bounds(scraped: Optional[Scrape]) -> Tuple[float, ...]:
    """The seconds histograms' bucket bounds (they share one set)."""
    if scraped is None:
        return ()
    for (family, _), cumulative in scraped.buckets.items():
        if family == "clip_flash_request_seconds":
            return tuple(sorted(cumulative))
    return ()
