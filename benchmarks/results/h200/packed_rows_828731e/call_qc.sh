#!/usr/bin/env bash
# One H200 at REV (literal full hash): the GPU tests of the one-call device step and the paths using it; the
# hand-offs at 50 one-JPEG req/s (ViT-L-14), OLD (.device/old_<rev>, built there) and this tree alternated
# old, new, old, new.
rev=$1; old=$2; R=/tmp/rqc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_qc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
O=.device/old_${old:0:7}
( cd $O && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "old build rc=$?" >> $R/build_old.log ) &
pack() { ( cd $R && tar -czf $OUT/call_qc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
export CLIP_FLASH_GIT_REVISION=$rev
run gpu_tests 150 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/inputs/test_packed_rows_gpu.py \
    tests/inputs/test_early_layout_gpu.py tests/serve/test_early_launch_gpu.py tests/ops/test_host_gate_gpu.py \
    tests/inputs/test_jpeg_dct_gpu.py
wait; tail -1 $R/build_old.log; ls $O/clip_flash/_C*.so
trace() {  # name tree revision
  local name=$1 tree=$2
  run $name 92 bash -c "cd $tree && CLIP_FLASH_GIT_REVISION=$3 python3 benchmarks/serve/handoff_trace.py --out $R/$name -- \
      --configs clip_flash --workloads image-raw --no-wrk --photos $PWD/.device/photos --rates 50 --duration 14"
}
trace trace_old_c $O $old
trace trace_new_c . $rev
trace trace_old_d $O $old
trace trace_new_d . $rev
pack; echo "all done at $(( $(date +%s) - start )) s"
