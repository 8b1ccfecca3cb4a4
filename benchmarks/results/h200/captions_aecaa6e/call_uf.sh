#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): ViT-L-14 one caption and 64 captions a request, rising rates until
# p99 passes 100 ms, refined.
rev=$1; R=/tmp/ruf; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_uf.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_uf.tgz . ); }
( timeout 300 python3 benchmarks/serve/bench_serve.py --results $R/captions --configs clip_flash \
    --workloads caption,captions64 --no-wrk --photos $PWD/.device/photos --start-rps caption=12000,captions64=1400 \
    --factor 1.2 --refine 2 --duration 3 --warmup 1 > $R/captions.log 2>&1; echo "rc=$?" >> $R/captions.log )
tail -n 4 $R/captions.log; pack; echo "all done at $(( $(date +%s) - start )) s"
