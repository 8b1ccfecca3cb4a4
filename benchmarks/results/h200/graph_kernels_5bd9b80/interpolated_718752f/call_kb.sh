#!/usr/bin/env bash
# One H200 at NEW (the H200 attention table shipped): fresh servers with the table and without it (the file moved
# away), one after the other. Given workloads: b32 (ViT-B-32 --decode gpu, one JPEG a request), caption (ViT-L-14,
# one caption a request), captions64 (ViT-L-14, 64 captions a request); each as WORKLOAD:SIDE_K.
new=$1; shift; R=/tmp/rkb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_kb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
T=clip_flash/backends/attention_tables/nvidia-h200.json
export CLIP_FLASH_GIT_REVISION=$new
pack() { ( cd $R && tar -czf $OUT/call_kb.tgz . ); }
srv() {  # workload side_k
  local w=$1 side=${2%_*} name=$1_$2 limit args
  case $w in
    b32) limit=95; args="--configs clip_flash-small-gpu --workloads image-raw --rates 7000,8000,9000 --duration 3";;
    caption) limit=90; args="--configs clip_flash --workloads caption --rates 12000,14000,16000 --duration 3";;
    captions64) limit=110; args="--configs clip_flash --workloads captions64 --rates 1500,1580,1660 --duration 6";;
  esac
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  [ $side = none ] && mv $T /tmp/h200_table.json
  (timeout $limit python3 benchmarks/serve/bench_serve.py $args --no-wrk --photos .device/photos \
      --results $R/$name > $R/$name.log 2>&1; echo rc=$? >> $R/$name.log)
  [ $side = none ] && mv /tmp/h200_table.json $T
  grep -E "^\| *[0-9]+,[0-9]00 " $R/$name/serve_bench.md | cut -d'|' -f2-10 | head -4; tail -n 1 $R/$name.log
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
for s in "$@"; do srv ${s%%:*} ${s#*:}; done
pack; echo "all done at $(( $(date +%s) - start )) s"
