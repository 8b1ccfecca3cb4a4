"""What the server's own ``/metrics`` say about a curve: batch sizes and per-stage seconds over its points.

Read before and after a curve; the difference of each histogram's sum and count gives the curve's means (the
batches it formed, how long they prepared and encoded, how long requests queued), which tell which stage bounds
a rate the curve could not pass. Servers without ``/metrics`` (the baselines) give nothing.
"""
from __future__ import annotations

import urllib.request
from typing import Dict, Optional, Tuple

from prometheus_client.parser import text_string_to_metric_families

# (family, label value) -> what the summary calls its mean
HISTOGRAMS = {"clip_flash_batch_size": "mean batch", "clip_flash_prepare_seconds": "mean prepare s",
              "clip_flash_encode_seconds": "mean encode s", "clip_flash_queue_seconds": "mean queued s"}

Totals = Dict[Tuple[str, str], Tuple[float, float]]  # (family, tower) -> (sum, count)


def scrape(base_url: str, timeout: float = 10.0) -> Optional[Totals]:
    """Sums and counts of the tower histograms, or None when the server has no clip_flash metrics."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except Exception:  # noqa: BLE001 - a baseline without /metrics
        return None
    totals: Totals = {}
    for family in text_string_to_metric_families(text):
        if family.name not in HISTOGRAMS:
            continue
        for sample in family.samples:
            tower = sample.labels.get("tower", "")
            total, count = totals.get((family.name, tower), (0.0, 0.0))
            if sample.name.endswith("_sum"):
                totals[(family.name, tower)] = (sample.value, count)
            elif sample.name.endswith("_count"):
                totals[(family.name, tower)] = (total, sample.value)
    return totals or None


def curve_means(before: Optional[Totals], after: Optional[Totals]) -> Dict[str, Dict[str, float]]:
    """Per tower, the mean of each histogram over what was observed between the two scrapes."""
    if before is None or after is None:
        return {}
    means: Dict[str, Dict[str, float]] = {}
    for (family, tower), (total, count) in after.items():
        old_total, old_count = before.get((family, tower), (0.0, 0.0))
        if count > old_count:
            means.setdefault(tower, {})[HISTOGRAMS[family]] = round((total - old_total) / (count - old_count), 6)
            if family == "clip_flash_batch_size":
                means[tower]["batches"] = count - old_count
    return means
