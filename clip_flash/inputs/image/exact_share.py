"""With ``decode="gpu"``: which of a batch's JPEGs the CPU decodes exactly beside nvJPEG's hardware decoder.

The hardware decoder is a fixed engine on the GPU, and while it works the host's cores are mostly idle (the
decoding threads wait in nvJPEG's call). A share of each batch's JPEGs therefore takes the exact route instead
(libjpeg-turbo's entropy decode on the CPU's native threads, the GPU finishing the decode: Pillow's pixels),
at the same time as the hardware decodes the rest: the two rates add up. Those rows are exact; the others are
nvJPEG's, as without the share. Which positions take the exact route depends only on the batch's size and the
share, so a job's rows are the same from run to run.
"""
from __future__ import annotations

from typing import List

# The default share balances the two routes' rates. On an H100 host with 16 cores, ViT-B-32's transform, web
# photos (benchmarks/results/h100/exact_share): the decode="gpu" job ran about 12,700 images/s steady,
# the same beside another process decoding exactly on 12 threads (8,790 images/s, 732 a thread). Per core the
# default counts 560, below that, for the reading and scanning every image still needs: 16 cores give a share
# of 0.35, which ran the job at 14,549-14,623 images/s steady against 12,526-12,916 without the share.
HARDWARE_IMAGES_PER_S = 12_700.0
EXACT_IMAGES_PER_CORE_S = 560.0
# Cores the decode="gpu" pipeline keeps busy without the share: reading files and scanning headers for the
# hardware's share, the thread launching the model, the writer.
RESERVED_CORES = 4
MAX_DEFAULT_SHARE = 0.5


def default_exact_share(cores: int) -> float:
    """The share of JPEGs decoded exactly when none is asked for: the exact route's rate on the cores left over
    as a share of both routes' rates (0 on 4 cores or fewer; about 0.35 on 16), at most ``MAX_DEFAULT_SHARE``."""
    exact_rate = EXACT_IMAGES_PER_CORE_S * max(0, cores - RESERVED_CORES)
    return min(MAX_DEFAULT_SHARE, exact_rate / (exact_rate + HARDWARE_IMAGES_PER_S))


def exact_positions(count: int, share: float) -> List[int]:
    """The positions among ``count`` items that take the exact route: ``round(count * share)`` of them (nearly),
    spread evenly (position i when ``floor((i + 1) * share)`` passes an integer)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the exact share must be from 0 to 1, got {share}")
    return [i for i in range(count) if int((i + 1) * share + 1e-9) > int(i * share + 1e-9)]
