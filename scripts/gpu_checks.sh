#!/usr/bin/env bash
# GPU verification run: build the extension, record the environment, run the GPU tests, then the bench.
# Usage (on a CUDA machine, from the repo root):  scripts/gpu_checks.sh OUTDIR [bench args...]
# Every file it writes names the GPU, versions and the exact command (results/ in the repo holds copies).
set -uo pipefail
out=${1:?output directory}; shift
mkdir -p "$out"
{ echo "# command: $0 $*"; echo "# git: ${CLIP_FLASH_GIT_REVISION:-$(git rev-parse HEAD 2>/dev/null)}"; date -u; nvidia-smi -L; } > "$out/environment.txt"
python3 -m clip_flash.info >> "$out/environment.txt" 2>&1
cp /tmp/build_ext.log "$out/build_ext.log" 2>/dev/null
if [ -z "${SKIP_GPU_TESTS:-}" ]; then
  python3 -m pytest -q -s -p no:cacheprovider ${GPU_TESTS:-tests} -k "${GPU_TEST_FILTER:-}" 2>&1 \
    | grep -v "^\s*$" > "$out/gpu_tests.log"
  tail -3 "$out/gpu_tests.log"
fi
