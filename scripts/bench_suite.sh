#!/usr/bin/env bash
# The committed benchmark runs: per model, text (real captions, batches of the published table plus 256 and
# 1024) and image (published batches plus 64 and 256), --times 100, random-init weights (labelled so).
# Usage: scripts/bench_suite.sh OUTDIR MODEL...   (writes OUTDIR/<model>-<tower>.{json,md})
set -uo pipefail
out=${1:?output directory}; shift
mkdir -p "$out"
for model in "$@"; do
  python3 scripts/bench_clip.py --model "$model" --towers text --text-input captions \
    --batch-sizes 1 2 4 8 16 256 1024 --times "${TIMES:-100}" \
    --json "$out/$model-text.json" --markdown "$out/$model-text.md" 2>>"$out/bench_stderr.txt" | head -16
  python3 scripts/bench_clip.py --model "$model" --towers image \
    --batch-sizes 1 2 4 8 16 64 256 --times "${TIMES:-100}" \
    --json "$out/$model-image.json" --markdown "$out/$model-image.md" 2>>"$out/bench_stderr.txt" | head -16
done
