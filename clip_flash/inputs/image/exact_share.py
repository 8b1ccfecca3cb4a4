"""With ``decode="gpu"``: which of a batch's JPEGs the CPU decodes exactly beside nvJPEG's hardware decoder.

The hardware decoder is a fixed engine on the GPU, and while it works the host's cores are mostly idle (the
decoding threads wait in nvJPEG's call). With an exact share, that share of each batch's inputs takes the exact
route instead (libjpeg-turbo's entropy decode on the CPU's native threads, the GPU finishing the decode: Pillow's
pixels) at the same time as the hardware decodes the rest. Those rows are exact; the others are nvJPEG's, as
without the share. Which positions take the exact route depends only on the batch's size and the share, so a
job's rows are the same from run to run.

Off by default (0), as the gain depends on the host. Measured with ViT-B-32 on 57,600 web photos, share 0 and
0.35 alternated, one H100 host (16 cores) at a time: on the first three hosts
(``benchmarks/results/h100/exact_share_7a386b9``) the steady rate moved by -3% to +17% and the rate after the model
load by -10% to +2%; the main thread waited for inputs half as long but launched about twice as long, the exact
route's device work being queued there. Since the decoding thread queues it (``resize_ahead_6b11839``), the main
thread launches no more than without the share, but still spends longer (2.1-2.9 against 1.1-1.3 s a run) waiting
for the GIL beside the decoding threads' Python. With nvJPEG also made ready during the model load, two more hosts
gave +8% and -1% (``exact_share_threads_4a3b39b``) and -1% to +18% (``shape_plans_5766e05``, every run with the share
above 13,000 img/s over the whole run, every run without it 12,283-12,395) over the run; a slow host ran -11% and
-20% steady (``resize_ahead_6b11839``). Where the host's cores are free, ``--exact-share 0.35`` raises the job past
the hardware decoder's own rate.
"""
from __future__ import annotations

from typing import List


def exact_positions(count: int, share: float) -> List[int]:
    """The positions among ``count`` items that take the exact route: ``round(count * share)`` of them (nearly),
    spread evenly (position i when ``floor((i + 1) * share)`` passes an integer)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the exact share must be from 0 to 1, got {share}")
    return [i for i in range(count) if int((i + 1) * share + 1e-9) > int(i * share + 1e-9)]
