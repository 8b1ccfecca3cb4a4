"""Latency-throughput curves: rising open-loop rates until p99 passes the target, then a few bisection steps.

A point *meets* the target when its p99 (successful requests, from scheduled send time) is at most the target
and its failed requests (any non-200 status, timeout or connection error) are at most ``max_error_fraction``
of those scheduled: a server that sheds load with fast 429s does not pass on latency alone. The curve's
result is the highest achieved rate among the points that meet it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence

from .load_generator import LoadSettings, PointResult, Workload, run_point


@dataclass(frozen=True)
class CurvePlan:
    """Which rates to offer. ``rates`` (if given) are run as listed, in order; otherwise rates start at
    ``start_rps`` and grow by ``factor`` until a point misses the target or passes ``max_rps`` (when the first
    point misses, they shrink by ``factor`` instead, at most ``max_down_steps`` times, until one meets it),
    then ``refine_steps`` geometric bisections between the highest rate that met it and the lowest that did
    not. Each point lasts long enough for ``min_requests`` measured requests (p99 needs a few hundred)."""

    start_rps: float = 50.0
    factor: float = 4.0
    max_rps: float = 200_000.0
    refine_steps: int = 5  # 4x steps, then 5 bisections: the rate found is within 4.4% of the highest that met
    max_down_steps: int = 6
    min_requests: int = 300
    rates: Optional[Sequence[float]] = None
    p99_target_ms: float = 100.0
    max_error_fraction: float = 0.001


@dataclass
class Curve:
    """One workload against one server: its points in the order run, and what they add up to."""

    server: str
    workload: Workload
    plan: CurvePlan
    points: List[PointResult] = field(default_factory=list)
    note: str = ""

    def meets(self, point: PointResult) -> bool:
        p99 = point.latency_ms(99.0)
        if p99 is None or p99 > self.plan.p99_target_ms:
            return False
        return point.error_count <= self.plan.max_error_fraction * max(point.scheduled, 1)

    @property
    def best(self) -> Optional[PointResult]:
        """The point that met the target with the highest achieved rate."""
        passing = [point for point in self.points if self.meets(point)]
        return max(passing, key=lambda point: point.achieved_rps) if passing else None

    def point_at(self, rate: float) -> Optional[PointResult]:
        for point in self.points:
            if math.isclose(point.offered_rps, rate, rel_tol=1e-6):
                return point
        return None

    def generator_warning(self) -> str:
        """A note when a point missed with the generator itself late by half the target or more: the client
        processes, not the server, may have been the limit there."""
        late = [point for point in self.points if not self.meets(point) and point.send_lag.get_total_count()
                and point.send_lag.get_value_at_percentile(99) / 1000.0 >= self.plan.p99_target_ms / 2]
        if not late:
            return ""
        rates = ", ".join(f"{point.offered_rps:,.0f}/s (lag p99 "
                          f"{point.send_lag.get_value_at_percentile(99) / 1000:,.0f} ms)" for point in late)
        return f"the generator sent late at {rates}: there the limit may be the client processes, not the server"

    def to_dict(self) -> Dict[str, object]:
        best = self.best
        return {
            "server": self.server,
            "workload": self.workload.name,
            "workload_description": self.workload.description,
            "p99_target_ms": self.plan.p99_target_ms,
            "max_error_fraction": self.plan.max_error_fraction,
            "points": [point.to_dict() | {"meets_target": self.meets(point)} for point in self.points],
            "throughput_at_target": None if best is None else {
                "requests_per_s": round(best.achieved_rps, 2),
                "items_per_s": round(best.achieved_items_per_s, 2),
                "offered_rps": round(best.offered_rps, 2),
            },
            "note": "; ".join(filter(None, [self.note, self.generator_warning()])),
        }


def run_curve(server: str, base_url: str, workload: Workload, plan: CurvePlan, settings: LoadSettings,
              on_point: Optional[Callable[[Curve, PointResult], None]] = None) -> Curve:
    """Run the rates of ``plan`` against ``base_url``; each point is a fresh open-loop run of ``settings``."""
    curve = Curve(server=server, workload=workload, plan=plan)

    def run(rate: float) -> bool:
        duration = max(settings.duration_s, plan.min_requests / rate)
        point = run_point(base_url, workload, rate, replace(settings, duration_s=duration), seed=len(curve.points))
        curve.points.append(point)
        if on_point:
            on_point(curve, point)
        return curve.meets(point)

    if plan.rates:
        for rate in plan.rates:
            run(float(rate))
        return curve
    last_met, first_missed = None, None
    rate = plan.start_rps
    while rate <= plan.max_rps:
        if run(rate):
            last_met = rate
            rate *= plan.factor
        else:
            first_missed = rate
            break
    if first_missed is None:
        curve.note = f"met the target at every rate up to {plan.max_rps:g}/s (the plan's ceiling)"
        return curve
    rate = first_missed / plan.factor
    for _ in range(plan.max_down_steps if last_met is None else 0):
        if run(rate):
            last_met = rate
            break
        first_missed = rate
        rate /= plan.factor
    if last_met is None:
        curve.note = f"missed the target at every rate down to {first_missed:g}/s"
        return curve
    for _ in range(plan.refine_steps):
        middle = math.sqrt(last_met * first_missed)
        if run(middle):
            last_met = middle
        else:
            first_missed = middle
    return curve
