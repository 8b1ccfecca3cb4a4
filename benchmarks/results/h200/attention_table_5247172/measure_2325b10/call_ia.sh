#!/usr/bin/env bash
# One H200 at NEW: the serve GPU tests touched by --no-cudnn-attention (and cost-packed beside it), the graphs'
# GPU tests, then an attention table for the H200 (clip-flash measure-attention; not installed by this run).
new=$1; R=/tmp/ria; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ia.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
pack() { ( cd $R && tar -czf $OUT/call_ia.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( CLIP_FLASH_GIT_REVISION=$new timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_serve 260 -m pytest -q -rs tests/serve/test_serve_gpu.py -k "cudnn or cost_packed or graphs_are_used"
tail -4 $R/gpu_tests_serve.log
run gpu_tests_graphs 120 -m pytest -q -rs -m gpu tests/graphs tests/backends
tail -3 $R/gpu_tests_graphs.log
run table 170 -m clip_flash.backends.measure_attention --out $R/table/nvidia-h200.json
tail -3 $R/table.log; ls $R/table
pack; echo "all done at $(( $(date +%s) - start )) s"
