"""With ``decode="gpu"``: which of a batch's JPEGs the CPU decodes exactly beside nvJPEG's hardware decoder.

The hardware decoder is a fixed engine on the GPU, and while it works the host's cores are mostly idle (the
decoding threads wait in nvJPEG's call). With an exact share, that share of each batch's inputs takes the exact
route instead (libjpeg-turbo's entropy decode on the CPU's native threads, the GPU finishing the decode: Pillow's
pixels) at the same time as the hardware decodes the rest. Those rows are exact; the others are nvJPEG's, as
without the share. Which positions take the exact route depends only on the batch's size and the share, so a
job's rows are the same from run to run.

Off by default (0): measured on three H100 hosts (16 cores, ViT-B-32, 57,600 web photos, 0 and 0.35 alternated
twice on each; ``benchmarks/results/h100/exact_share_7a386b9``), the job's main thread waited for inputs half as
long (2.7-3.3 -> 1.3-1.6 s a run) but spent about twice as long launching (1.2-1.9 -> 2.6-3.4 s: the exact
route's copies and kernels are launched there, beside the hardware's rows), so the steady rate moved by -3% to
+17% depending on the host, and a run's rate after the model load by -10% to +2%.
"""
from __future__ import annotations

from typing import List


def exact_positions(count: int, share: float) -> List[int]:
    """The positions among ``count`` items that take the exact route: ``round(count * share)`` of them (nearly),
    spread evenly (position i when ``floor((i + 1) * share)`` passes an integer)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the exact share must be from 0 to 1, got {share}")
    return [i for i in range(count) if int((i + 1) * share + 1e-9) > int(i * share + 1e-9)]
