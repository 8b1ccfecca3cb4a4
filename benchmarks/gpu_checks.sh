#!/usr/bin/env bash
# On a CUDA machine, from the repository root: every GPU test, then the ViT-L-14 image and text benchmarks
# compared with the committed H100 runs. Results and logs go under OUT (first argument, default ./gpu_checks).
#
#   bash benchmarks/gpu_checks.sh OUT tests      # pytest -m gpu over tests/ (log: OUT/gpu_tests_REV.log)
#   bash benchmarks/gpu_checks.sh OUT bench      # bench_clip.py ViT-L-14 image + text, compare_results.py
set -uo pipefail
out=${1:-gpu_checks}
shift || true
steps=${*:-tests bench}
mkdir -p "$out"
rev=${CLIP_FLASH_GIT_REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
rev=${rev:0:7}
status=0
for step in $steps; do
    case $step in
    tests)
        python3 -m pytest -m gpu -q -rs --durations=25 -o faulthandler_timeout=300 -p no:cacheprovider tests \
            2>&1 | tee "$out/gpu_tests_$rev.log" || status=1 ;;
    slow)
        python3 -m pytest -m slow --run-slow -q -rs --durations=10 -p no:cacheprovider tests \
            2>&1 | tee "$out/slow_tests_$rev.log" || status=1 ;;
    bench)
        python3 scripts/bench_clip.py --model ViT-L-14 --towers image --batch-sizes 1 16 64 256 --times 30 \
            --json "$out/ViT-L-14-image_$rev.json" --markdown "$out/ViT-L-14-image_$rev.md" || status=1
        python3 scripts/bench_clip.py --model ViT-L-14 --towers text --text-input captions \
            --batch-sizes 1 2 4 8 16 256 1024 --times 100 \
            --json "$out/ViT-L-14-text_$rev.json" --markdown "$out/ViT-L-14-text_$rev.md" || status=1
        for tower in image text; do
            python3 benchmarks/compare_results.py "benchmarks/results/h100/ViT-L-14-$tower.json" \
                "$out/ViT-L-14-${tower}_$rev.json" 2>&1 | tee "$out/compare_ViT-L-14-${tower}_$rev.txt"
        done ;;
    *) echo "unknown step $step (tests, slow, bench)" >&2; status=2 ;;
    esac
done
exit $status
