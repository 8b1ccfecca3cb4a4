#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash) against OLD (.device/old_<rev>, built there): the GPU tests of the
# CUDA graphs (the one-call replay against torch's steps) and the padded and packed caption graphs; then a lone
# JPEG request's host steps in a loop after 20 ms asleep (as a server's at 50 req/s), old and new alternated
# old, new, old, new.
rev=$1; old=$2; R=/tmp/rsa; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_sa.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
O=.device/old_${old:0:7}
( cd $O && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "old build rc=$?" >> $R/build_old.log ) &
pack() { ( cd $R && tar -czf $OUT/call_sa.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
export CLIP_FLASH_GIT_REVISION=$rev
run gpu_tests_graphs 200 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/graphs
wait; tail -1 $R/build_old.log; ls $O/clip_flash/_C*.so
latency() {  # name tree revision
  local name=$1 tree=$2
  run $name 80 bash -c "cd $tree && CLIP_FLASH_GIT_REVISION=$3 python3 benchmarks/image_latency.py --photos \
      $PWD/.device/photos --model ViT-L-14 --requests 200 --warmup 30 --host-steps --idle-ms 20 \
      --json $R/$name.json --markdown $R/$name.md"
}
latency latency_old_a $O $old
latency latency_new_a . $rev
latency latency_old_b $O $old
latency latency_new_b . $rev
pack; echo "all done at $(( $(date +%s) - start )) s"
