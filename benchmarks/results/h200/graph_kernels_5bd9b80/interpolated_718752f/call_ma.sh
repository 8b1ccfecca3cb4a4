#!/usr/bin/env bash
# One H200 at NEW (literal full hash; carry .device with photos384): the interpolated attention choice with the
# shipped H200 table. GPU tests of backends/graphs/patching; ViT-L-14 caption graphs' kernels (table, none);
# the ViT-B-32 decode="gpu" job (table, none); ViT-L-14 one caption a request (table, none, none, table), fresh
# processes, the table file moved away for "none"; then the L-14 engine's text replay costs timed again, alone and
# back to back (startup_profile --retime-text).
new=$1; R=/tmp/rma; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ma.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
rm -rf /tmp/photos384 && cp -r .device/photos384 /tmp/photos384
T=clip_flash/backends/attention_tables/nvidia-h200.json
export CLIP_FLASH_GIT_REVISION=$new
pack() { ( cd $R && tar -czf $OUT/call_ma.tgz . ); }
run() {  # name limit side command...
  local name=$1 limit=$2 side=$3; shift 3
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  [ $side = none ] && mv $T /tmp/h200_table.json
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  [ $side = none ] && mv /tmp/h200_table.json $T
  tail -n 1 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
python3 -m clip_flash.info > $R/info.txt 2>&1
run gpu_tests 120 table python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/backends tests/graphs tests/patching
tail -n 2 $R/gpu_tests.log
for side in table none; do
  run kernels_L14_$side 70 $side python3 benchmarks/graph_attention_kernels.py --model ViT-L-14 --label $side \
      --text-rows 1 16 32 48 64 --text-lengths 8 16 32 77 --image-rows 1 --json $R/kernels_L14_$side.json \
      --markdown $R/kernels_L14_$side.md
done
for side in table none; do
  run job_$side 60 $side python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 150 \
      --cases gpu-decode --no-stock --captions 0 --encoder-calls 5 --results $R/job_$side
  grep "^| ViT-B-32" $R/job_$side/embed_bench.md | head -1 | cut -d'|' -f7-8
done
for sk in table_a none_a none_b table_b; do
  run caption_$sk 80 ${sk%_*} python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads caption \
      --rates 12000,14000,16000 --duration 3 --no-wrk --photos .device/photos --results $R/caption_$sk
  grep -A4 "^| offered req/s | arrived" $R/caption_$sk/serve_bench.md | tail -3 | cut -d'|' -f2-8
done
run startup_L14 75 table python3 benchmarks/serve/startup_profile.py --model ViT-L-14 --retime-text --results $R/startup_L14
grep -E "^Padded text" $R/startup_L14/startup_profile.md
pack; echo "all done at $(( $(date +%s) - start )) s"
