"""What a run of the embedding job's pipeline did: counts, timings, where its main thread waited, and the
page-locked host blocks it had to make (shared by the pipeline, the stock baseline and the Ray actors)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

MAIN_THREAD_STEPS = ("warming up the device", "waiting for inputs", "launching", "waiting for the device",
                     "handing to the writer")


@dataclass
class PipelineStats:
    """What a run of the pipeline did."""

    rows: int = 0
    failures: int = 0
    shards: int = 0
    seconds: float = 0.0
    marks: List[Tuple[int, float]] = field(default_factory=list)  # (inputs so far, seconds) per shard
    first_batch_seconds: Optional[float] = None  # run start to the first batch's embeddings on the host
    # Where the main thread's time went: what it waited on says which stage bounds the run.
    main_thread_seconds: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(MAIN_THREAD_STEPS, 0.0))
    warm_up_seconds: float = 0.0  # the device half of the warm-up, when it ran at the start of this run
    warm_up_steps: Dict[str, float] = field(default_factory=dict)  # its steps' ends, seconds into it
    # Page-locked host blocks torch's allocator had to create during the run, and the seconds CUDA took to make
    # them: a cold allocator shows here (a block is made once per power-of-two size and batch in flight).
    pinned_blocks_created: int = 0
    pinned_block_seconds: float = 0.0
    pinned_block_bytes: int = 0  # their sizes together (as rounded up by the allocator): which blocks they were


def pinned_allocator_counters() -> Tuple[int, float, int]:
    """(blocks created, seconds spent creating them, their bytes) so far by torch's page-locked host allocator
    ((0, 0.0, 0) before CUDA is initialised)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0, 0.0, 0
    stats = torch.cuda.host_memory_stats()
    return (int(stats.get("num_host_alloc", 0)), float(stats.get("host_alloc_time.total", 0)) / 1e6,
            int(stats.get("allocated_bytes.allocated", 0)))
