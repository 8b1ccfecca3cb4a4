"""The start-up profile's comparison of the engine's text replay costs with a second timing of the same graphs."""
from __future__ import annotations

from benchmarks.serve.startup_profile import describe_retimed


def test_retimed_costs_are_compared_graph_by_graph_and_inversions_counted():
    engine = {"1x8": 0.5, "2x8": 0.6, "4x8": 0.55, "1x16": 0.5, "2x16": 0.7}  # 2x8 costlier than 4x8: one inversion
    queued = {"1x8": 0.4, "2x8": 0.45, "4x8": 0.5, "1x16": 0.42, "2x16": 0.5}
    text = describe_retimed(engine, queued, "back to back")
    assert "5 graphs, the engine's time x 0.800 (median; 0.714-0.909)" in text
    assert "1 in the engine's table, 0 back to back" in text
