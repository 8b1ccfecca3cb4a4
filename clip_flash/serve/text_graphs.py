"""The server's caption graphs: capturing them (``capture_text_graphs``), timing their replays (``ReplayCosts``),
cutting a caption batch into length groups where those replays cost least (``cheapest_groups``), and choosing per
group between a padded graph and a packed one (``CheapestTextEncode``, ``with_packed_graphs``)."""
from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)


def token_rows_of_length(rows: int, length: int, context_length: int) -> Any:
    """``rows`` identical token rows whose end-of-text is at position ``length - 1`` (OpenCLIP's SOT/EOT ids):
    what picks a text graph is the pooled position alone."""
    tokens = torch.zeros((rows, context_length), dtype=torch.long)
    tokens[:, 0], tokens[:, 1:length - 1], tokens[:, length - 1] = 49406, 1, 49407
    return tokens


def capture_text_graphs(encoder: Any, sizes: Sequence[int], lengths: Sequence[int], context_length: int) -> None:
    """Capture ``encoder``'s text graph for every batch size and length bucket, largest first (so its memory
    pool is sized once)."""
    for size in sorted(sizes, reverse=True):
        for length in sorted(lengths, reverse=True):
            encoder.encode_text(token_rows_of_length(size, length, context_length))


def time_text_replays(encoder: Any, sizes: Sequence[int], lengths: Sequence[int], context_length: int,
                      repeats: int = 2) -> Dict[Tuple[int, int], float]:
    """Device milliseconds of one replay of each captured text graph, by (rows, length bucket): the median of
    ``repeats`` after a warm one, each alone (CUDA events around it, the device idle before), copies in and out
    included. About a second for the 224 graphs of ViT-L-14 at four sizes per doubling."""
    from clip_flash.ops.cuda_timing import median_cuda_ms

    times: Dict[Tuple[int, int], float] = {}
    for size in sizes:
        for length in lengths:
            tokens = token_rows_of_length(size, length, context_length)
            times[(size, length)] = median_cuda_ms(lambda: encoder.encode_text(tokens), repeats, each_alone=True)
    return times


class CheapestTextEncode:
    """Text features of a caption group by whichever of two graphs the measured costs say is cheaper: its padded
    text graph (``graphed``: the group padded to its length bucket and rows bucket) or the packed text graph of
    its real tokens (``packed``: ``graphs.PackedTextGraphs``, padded only to a token-count bucket).

    ``costs``: both kinds' replay times (``ReplayCosts``); until the packed ones are measured every
    group replays padded. Token ids come on the host, as ``TextInputs`` keeps them."""

    def __init__(self, graphed: Callable[[Any], Any], packed: Callable[[Any], Any], costs: Any, max_rows: int) -> None:
        self.graphed = graphed
        self.packed = packed
        self.costs = costs
        self.max_rows = max_rows

    def __call__(self, tokens: Any) -> Any:
        return self.packed(tokens) if self.takes_packed(tokens) else self.graphed(tokens)

    def takes_packed(self, tokens: Any) -> bool:
        """Whether the packed graph is measured to cost less than the padded one for these host ids."""
        if tokens.device.type != "cpu" or not 0 < tokens.shape[0] <= self.max_rows or not self.costs.packed_points:
            return False
        counts = np.count_nonzero(tokens.numpy(), axis=1)
        graph_ms = self.costs(len(counts), self.costs.length_bucket(int(counts.max())))
        return self.costs.packed(int(counts.sum())) < graph_ms


class ReplayCosts:
    """Device milliseconds of one text-graph replay by (graph rows, length bucket), as measured on this device
    once the graphs are captured (``time_text_replays``): what one length group of a caption batch costs.
    A group of ``rows`` captions runs the smallest graph holding them; past the largest, that one per piece.

    ``packed_points``: (token count, milliseconds) of one replay of each packed text graph
    (``graphs.PackedTextGraphs``), set once they are timed: a group of ``tokens`` real tokens replays the cheapest
    holding them."""

    def __init__(self, ms: Dict[Tuple[int, int], float]) -> None:
        if not ms:
            raise ValueError("no replay times")
        self.ms = dict(ms)
        self.sizes = sorted({rows for rows, _ in ms})
        self.lengths = sorted({length for _, length in ms})
        self.packed_points: List[Tuple[int, float]] = []

    def __call__(self, rows: int, length: int) -> float:
        largest = self.sizes[-1]
        if rows > largest:
            return math.ceil(rows / largest) * self.ms[(largest, length)]
        return self.ms[(self.sizes[bisect_left(self.sizes, rows)], length)]

    def length_bucket(self, longest: int) -> int:
        """The graph length a group whose longest caption has ``longest`` tokens replays at."""
        return self.lengths[min(bisect_left(self.lengths, longest), len(self.lengths) - 1)]

    def packed(self, tokens: int) -> float:
        """Milliseconds of the packed replay of ``tokens`` real tokens: the cheapest measured graph holding them,
        as ``PackedTextGraphs.bucket_for`` picks it (inf: none holds them)."""
        return min((ms for count, ms in self.packed_points if count >= tokens), default=math.inf)


def cost_groups(counts: Sequence[int], costs: ReplayCosts) -> List[List[int]]:
    """Positions sorted by token count, cut into groups of whole length buckets where the summed replay cost is
    least (``cheapest_groups`` without the cost)."""
    return cheapest_groups(counts, costs)[0]


def cheapest_groups(counts: Sequence[int], costs: ReplayCosts) -> Tuple[List[List[int]], float]:
    """Positions sorted by token count, cut into groups of whole length buckets where the summed replay cost is
    least, and that sum (ms): a group runs at its longest caption's bucket, so joining two neighbouring buckets
    pays the shorter one's padding and saves one replay (its fixed cost: a graph of a dozen layers launches some
    hundred kernels whatever its rows). Exact over the cuts at bucket changes (at most one per length bucket), by
    dynamic programming."""
    counts = np.asarray(counts)
    order = np.argsort(counts, kind="stable")
    limits = costs.lengths
    # a count's bucket: the first limit it fits in (a count past the last limit is the last limit's)
    bucket = np.minimum(np.searchsorted(np.asarray(limits), counts[order], side="left"), len(limits) - 1)
    cuts = [0] + (np.flatnonzero(np.diff(bucket)) + 1).tolist() + [len(order)]
    best = [0.0] + [math.inf] * (len(cuts) - 1)
    back = [0] * len(cuts)
    for end in range(1, len(cuts)):
        length = limits[int(bucket[cuts[end] - 1])]
        for start in range(end):
            total = best[start] + costs(cuts[end] - cuts[start], length)
            if total < best[end]:
                best[end], back[end] = total, start
    groups: List[List[int]] = []
    end = len(cuts) - 1
    while end > 0:
        start = back[end]
        groups.append(order[cuts[start]:cuts[end]].tolist())
        end = start
    return groups[::-1], best[-1]


def with_packed_graphs(model: Any, graphed: Callable[[Any], Any], costs: ReplayCosts, max_rows: int) -> Callable:
    """``CheapestTextEncode`` over the padded text graphs (``graphed``) and packed ones captured and timed now (their
    times go into ``costs``); ``graphed`` alone, with the reason logged, where the text tower cannot pack or a
    capture fails."""
    from clip_flash.graphs.packed_text import PackedTextGraphs

    started = time.perf_counter()
    try:
        packed = PackedTextGraphs(model, max_rows=max_rows)
    except ValueError as error:
        logger.info("packed text graphs: %s; caption groups replay padded graphs only", error)
        return graphed
    try:
        packed.capture_all()
        packed_ms = packed.time_replays()
    except RuntimeError as error:  # a failed capture: the padded graphs serve every group
        logger.warning("packed text graphs: %s; caption groups replay padded graphs only", error)
        return graphed
    costs.packed_points = sorted(packed_ms.items())
    logger.info("captured and timed %d packed text graphs in %.1f s (%.0f MiB)", len(packed.graphs),
                time.perf_counter() - started, packed.space.pool_bytes(0) / 2**20)
    return CheapestTextEncode(graphed, packed.encode_text, costs, packed.max_rows)
