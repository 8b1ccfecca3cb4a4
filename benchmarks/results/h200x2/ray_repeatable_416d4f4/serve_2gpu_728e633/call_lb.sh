#!/usr/bin/env bash
# On the two-GPU machine (nvidia-h200-x2) at REV (literal full hash; carry .device): ViT-L-14 one JPEG a request,
# the server on one GPU and on --devices 0,1 in one bench run (issue 28's target: two GPUs at least 1.8x one).
rev=$1; R=/tmp/rlb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_lb.sh $R/; nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt
pack() { ( cd $R && tar -czf $OUT/call_lb.tgz . ); }
CLIP_FLASH_GIT_REVISION=$rev timeout 540 python3 benchmarks/serve/bench_serve.py --workloads image-raw --no-wrk \
    --photos .device/photos --start-rps image-raw=1600 --factor 1.5 --duration 3 --processes 12 \
    --configs clip_flash,clip_flash-2gpu --results $R/serve > $R/serve.log 2>&1; echo "rc=$?" >> $R/serve.log
grep -E "^### |^\| *[0-9]+,[0-9]+\.0 " $R/serve/serve_bench.md | cut -d'|' -f1-8,12 | head -30; tail -n 3 $R/serve.log
pack; echo "all done at $(( $(date +%s) - start )) s"
