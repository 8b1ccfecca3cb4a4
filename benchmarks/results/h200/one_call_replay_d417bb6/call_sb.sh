#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash) against OLD (.device/old_<rev>, built there): the hand-offs of one
# JPEG a request at 50 req/s (ViT-L-14), old and new alternated old, new, old, new (the encoder's call to its
# graph's replay, and after), after the GPU tests of the one-call replay and the encoder.
rev=$1; old=$2; R=/tmp/rsb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_sb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
O=.device/old_${old:0:7}
( cd $O && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "old build rc=$?" >> $R/build_old.log ) &
pack() { ( cd $R && tar -czf $OUT/call_sb.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
export CLIP_FLASH_GIT_REVISION=$rev
run gpu_tests_replay 90 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/graphs/test_graph_replay_gpu.py tests/graphs/test_graphed_encoder.py
wait; tail -1 $R/build_old.log
trace() {  # name tree revision
  local name=$1 tree=$2
  run $name 92 bash -c "cd $tree && CLIP_FLASH_GIT_REVISION=$3 python3 benchmarks/serve/handoff_trace.py --out $R/$name -- \
      --configs clip_flash --workloads image-raw --no-wrk --photos $PWD/.device/photos --rates 50 --duration 14"
}
trace trace_old_a $O $old
trace trace_new_a . $rev
trace trace_old_b $O $old
trace trace_new_b . $rev
pack; echo "all done at $(( $(date +%s) - start )) s"
