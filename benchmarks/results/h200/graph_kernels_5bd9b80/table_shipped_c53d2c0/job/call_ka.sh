#!/usr/bin/env bash
# One H200 at NEW (the H200 attention table measured at 8/16/32/77 caption tokens shipped): GPU tests of the
# backends, graphs and patch with it in use; then the ViT-B-32 decode="gpu" job over 57,600 files with the table and
# without it (the file moved away), in the order given (SIDE_K ...), each job a fresh process.
new=$1; shift; R=/tmp/rka; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ka.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
rm -rf /tmp/photos384 && cp -r .device/photos384 /tmp/photos384
T=clip_flash/backends/attention_tables/nvidia-h200.json
export CLIP_FLASH_GIT_REVISION=$new
pack() { ( cd $R && tar -czf $OUT/call_ka.tgz . ); }
python3 -m clip_flash.info > $R/info.txt 2>&1
timeout 120 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/backends tests/graphs tests/patching > $R/gpu_tests_patch.log 2>&1
echo "rc=$?" >> $R/gpu_tests_patch.log; tail -n 2 $R/gpu_tests_patch.log; echo "tests done at $(( $(date +%s) - start )) s"; pack
job() {  # side k
  now=$(date +%s); if (( now - start > 470 )); then echo "skip $1_$2"; return; fi
  [ $1 = none ] && mv $T /tmp/h200_table.json
  timeout 100 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 150 --cases gpu-decode \
      --no-stock --captions 0 --encoder-calls 5 --results $R/job_$1_$2 > $R/job_$1_$2.log 2>&1; echo "rc=$?" >> $R/job_$1_$2.log
  [ $1 = none ] && mv /tmp/h200_table.json $T
  grep -iE "img/s|images/s" $R/job_$1_$2/embed_bench.md | head -3 | cut -c1-200
  echo "job_$1_$2 done at $(( $(date +%s) - start )) s"; pack
}
for s in "$@"; do job ${s%_*} ${s#*_}; done
pack; echo "all done at $(( $(date +%s) - start )) s"
