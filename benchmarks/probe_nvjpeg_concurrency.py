#!/usr/bin/env python
"""How many photos per second the fast path's hardware route decodes, from one thread or several at once.

    python benchmarks/probe_nvjpeg_concurrency.py --photos .device/photos --json out.json

The route a decoding thread runs per batch (``decode_into_layout``: layout, one nvJPEG hardware decode into
the resize kernel's buffer, the chroma step), on JPEGs already in memory: no file reading, no model. For each
``--threads`` count it runs with one decoder state shared by the threads and with one each
(``ImagePreprocessor(nvjpeg_decoders=N)``), every thread decoding ``--batches`` batches of ``--batch`` photos,
alternated over ``--rounds``; the medians over rounds are reported. The rate with one thread and one decoder is
the route's own ceiling; what more threads add shows whether the decoder (the hardware) or the threads bound it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.harness.results import environment_record  # noqa: E402
from benchmarks.harness.workloads import image_files  # noqa: E402
from clip_flash.inputs.image import nvjpeg_packed  # noqa: E402
from clip_flash.inputs.image.preprocessor import ImagePreprocessor  # noqa: E402
from clip_flash.inputs.image.transform_spec import ImageTransformSpec  # noqa: E402
from open_clip.transform import image_transform  # noqa: E402


def rate(items, spec: ImageTransformSpec, threads: int, decoders: int, batches: int) -> float:
    """Photos/s of ``threads`` threads each decoding ``batches`` batches through the route."""
    device = torch.device("cuda", torch.cuda.current_device())

    def work(_: int) -> int:
        done = 0
        for _ in range(batches):
            packed = nvjpeg_packed.decode_into_layout(items, device, spec, "libjpeg", decoders)
            if packed is None:
                raise RuntimeError(f"the hardware route did not run: {nvjpeg_packed._HARDWARE['unavailable']}")
            packed.ready.synchronize()
            done += len(packed.decoded)
        return done

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))  # warm-up: each thread's stream and decoder state
        torch.cuda.synchronize()
        started = time.perf_counter()
        decoded = sum(pool.map(work, range(threads)))
        torch.cuda.synchronize()
    return decoded / (time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=20, help="batches each thread decodes per measurement")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here", file=sys.stderr)
        return 2
    paths = image_files(args.photos)
    files = [paths[index % len(paths)] for index in range(args.batch)]  # cycled when fewer
    # ViT-B-32's eval transform: the layout's tables depend on it, not the decode.
    with ImagePreprocessor(image_transform(224, is_train=False), device="cuda", decode="gpu", executor="thread",
                           workers=4, nvjpeg_hardware=False) as prep:
        decoded = prep.decode(files)
        spec = prep.resize.spec
    items = [item for item in decoded.items if nvjpeg_packed.takes(item)]
    cases = [(threads, decoders) for threads in args.threads for decoders in sorted({1, threads})]
    runs = {case: [] for case in cases}
    for _ in range(args.rounds):
        for threads, decoders in cases:
            runs[(threads, decoders)].append(rate(items, spec, threads, decoders, args.batches))
    command = "python " + " ".join(shlex.quote(arg) for arg in [sys.argv[0], *(argv or sys.argv[1:])])
    rows = []
    for (threads, decoders), rates in runs.items():
        rows.append({"threads": threads, "decoders": decoders, "photos_per_s_median": statistics.median(rates),
                     "photos_per_s_runs": rates})
        print(f"{len(items)} photos per batch, {threads} thread(s), {decoders} decoder(s): "
              f"median {statistics.median(rates):,.0f} photos/s (runs {', '.join(f'{r:,.0f}' for r in rates)})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**environment_record(torch.device("cuda"), command), "photos": len(items),
                                     "batches_per_thread": args.batches, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
