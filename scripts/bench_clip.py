#!/usr/bin/env python
"""Stock vs ``clip_flash.patch``-ed OpenCLIP, same weights and inputs (``clip-flash bench`` is the same command).

    python scripts/bench_clip.py --model ViT-L-14::laion2b-s32b-b82k --times 100

The benchmark lives in ``benchmarks/bench_clip.py``; this path is where users have always run it.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's clip_flash and benchmarks

from benchmarks.bench_clip import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
