"""From a table's measured shapes to a backend for any shape: each backend's time estimated at the call's shape,
then the choice, which leaves torch's own kernel only for a clear gain.

Estimating: between the measured shapes that bracket the call (in batch, then in sequence length), each backend's
time is interpolated on log-log axes (attention time grows about as a power of batch and length); outside the
measured range the nearest edge counts. A backend is compared only where it was timed at every bracketing shape.
The single nearest shape's winner is not enough: the H200 table times flash 4% ahead of cuDNN at 16 captions of 77
tokens and far behind at 256; taken from the nearest shape, flash ran for 32-64 captions, whose CUDA graphs then spent
1.4-1.6x cuDNN's attention time (``benchmarks/results/h200/graph_kernels_5bd9b80``).

Choosing: backends within ``TIE_MARGIN`` of the fastest estimate count as tied, and a tie goes to the kernel torch's
SDPA runs by itself (``SDPA_PREFERENCE``), which is what runs without a table. Timings of one kernel alone differ
from the same kernel inside a model's graph by about that much (that 4% lead was a 13% loss in the graph).

Pure Python on ints and floats (no tensors, no device sync): torch.compile traces it and CUDA-graph capture is
unaffected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

# A kernel torch prefers stays chosen while its estimate is at most this much above the fastest one's.
TIE_MARGIN = 0.10
# The order torch 2.11's SDPA tries its fused kernels in on Hopper (it runs the first that serves a call); ties on
# other GPUs follow it too.
SDPA_PREFERENCE: Tuple[str, ...] = ("sdpa:cudnn", "sdpa:flash", "sdpa:efficient")


@dataclass(frozen=True)
class TimedShape:
    """One measured shape of a site's kind, with the milliseconds of the backends that may run here."""

    heads: int
    batch: int
    seq: int
    ms: Mapping[str, float]


def _log(value: int) -> float:
    return math.log(max(value, 1))


def _bracket(values: Sequence[int], value: int) -> Tuple[int, int, float]:
    """The measured values below and above ``value`` (the edge one twice outside the range) and ``value``'s
    position between them in log space (0 at the lower, 1 at the upper)."""
    ordered = sorted(set(values))
    if value <= ordered[0]:
        return ordered[0], ordered[0], 0.0
    if value >= ordered[-1]:
        return ordered[-1], ordered[-1], 0.0
    upper_index = next(i for i, v in enumerate(ordered) if v >= value)
    low, high = ordered[upper_index - 1], ordered[upper_index]
    if high == value:
        return high, high, 0.0
    return low, high, (_log(value) - _log(low)) / (_log(high) - _log(low))


def _between(low: Mapping[str, float], high: Mapping[str, float], weight: float) -> Dict[str, float]:
    """Per backend timed at both ends, its time ``weight`` of the way from ``low`` to ``high`` on a log scale."""
    return {name: math.exp((1.0 - weight) * math.log(low[name]) + weight * math.log(high[name]))
            for name in low if name in high}


def estimate_ms(shapes: Sequence[TimedShape], heads: int, batch: int, seq: int) -> Dict[str, float]:
    """Each backend's estimated milliseconds at (heads, batch, seq), from the shapes with the nearest head count.

    Interpolates in batch at each of the two measured lengths around ``seq``, then between those lengths. Where
    no backend was timed at every bracketing shape, the single nearest shape's timings stand."""
    pool = [shape for shape in shapes if shape.ms]
    if not pool:
        return {}
    nearest_heads = min({shape.heads for shape in pool}, key=lambda h: (abs(_log(h) - _log(heads)), h))
    pool = [shape for shape in pool if shape.heads == nearest_heads]
    seq_low, seq_high, seq_weight = _bracket([shape.seq for shape in pool], seq)

    def at_length(length: int) -> Dict[str, float]:
        row = [shape for shape in pool if shape.seq == length]
        batch_low, batch_high, batch_weight = _bracket([shape.batch for shape in row], batch)
        low = next(shape.ms for shape in row if shape.batch == batch_low)
        high = next(shape.ms for shape in row if shape.batch == batch_high)
        return _between(low, high, batch_weight)

    estimates = _between(at_length(seq_low), at_length(seq_high), seq_weight)
    if estimates:
        return estimates
    nearest = min(pool, key=lambda shape: ((_log(shape.batch) - _log(batch)) ** 2 + (_log(shape.seq) - _log(seq)) ** 2,
                                           shape.batch, shape.seq))
    return dict(nearest.ms)


def choose(estimates: Mapping[str, float], margin: float = TIE_MARGIN) -> Optional[str]:
    """The backend to run given estimated times: the fastest, unless a kernel torch's SDPA prefers is within
    ``margin`` of it (then the most preferred of those). None when nothing was timed."""
    if not estimates:
        return None
    fastest = min(estimates.values())
    tied = [name for name, ms in estimates.items() if ms <= fastest * (1.0 + margin)]

    def rank(name: str) -> Tuple[int, float, str]:
        preference = SDPA_PREFERENCE.index(name) if name in SDPA_PREFERENCE else len(SDPA_PREFERENCE)
        return preference, estimates[name], name

    return min(tied, key=rank)


def choose_at(shapes: Sequence[TimedShape], heads: int, batch: int, seq: int) -> Optional[str]:
    """The backend for a call of this shape: ``choose`` over ``estimate_ms``."""
    return choose(estimate_ms(shapes, heads, batch, seq))


def winners(shapes: Sequence[TimedShape]) -> List[str]:
    """The backends chosen at the measured shapes themselves, most often chosen first."""
    counts: Dict[str, int] = {}
    for shape in shapes:
        name = choose(shape.ms)
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return sorted(counts, key=lambda name: (-counts[name], name))


__all__ = ["TIE_MARGIN", "SDPA_PREFERENCE", "TimedShape", "estimate_ms", "choose", "choose_at", "winners"]
