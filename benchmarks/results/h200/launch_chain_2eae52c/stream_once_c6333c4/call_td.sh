#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash) against OLD (.device/old_<rev>, built there): one JPEG a request
# (ViT-L-14) untraced at 50 and 400 req/s, old and new alternated old, new, old, new, after the GPU tests of the
# host gate and the early launch.
rev=$1; old=$2; R=/tmp/rtd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_td.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
O=.device/old_${old:0:7}
( cd $O && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "old build rc=$?" >> $R/build_old.log ) &
pack() { ( cd $R && tar -czf $OUT/call_td.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 560 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
curve() {  # name tree revision
  local name=$1 tree=$2
  run $name 100 bash -c "cd $tree && CLIP_FLASH_GIT_REVISION=$3 python3 benchmarks/serve/bench_serve.py --results $R/$name \
      --configs clip_flash --workloads image-raw --no-wrk --photos $PWD/.device/photos --rates 50,400 --duration 10"
}
run gpu_tests_gate_early 75 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/ops/test_host_gate_gpu.py tests/serve/test_early_launch_gpu.py
wait; tail -1 $R/build_old.log
curve serve_old_a $O $old
curve serve_new_a . $rev
curve serve_old_b $O $old
curve serve_new_b . $rev
pack; echo "all done at $(( $(date +%s) - start )) s"
