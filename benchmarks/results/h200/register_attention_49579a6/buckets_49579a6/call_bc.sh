#!/usr/bin/env bash
# One H200: NEW (16 packed token buckets a doubling) against VAR (8, the revision before; its extension is NEW's,
# csrc unchanged between them). GPU tests of the server, the job and the packed text graphs at NEW; ViT-L-14 packed
# caption batches at 16 and 8 buckets a doubling (one tree, --packed-per-doubling); the server at 64 captions a
# request, fresh servers NEW, VAR, then NEW again while time is left.
new=$1; var=$2; R=/tmp/rbc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_bc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log
cp clip_flash/_C*.so .var_tree/clip_flash/
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_bc.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 170 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve tests/jobs tests/graphs/test_packed_text_gpu.py > $R/gpu_tests_serve_jobs_packed_$new.log 2>&1
tail -n 3 $R/gpu_tests_serve_jobs_packed_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_serve_jobs_packed_$new.log | head; echo "tests done at $(( $(date +%s) - start )) s"; pack
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
text() { run text_$1 $root $new 80 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 --packed-per-doubling $2 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; grep -E "^Encoder alone" $R/text_$1.md | sed 's/.*Capture/Capture/' | cut -c1-160; }
serve() { run serve_$1 $2 $3 110 benchmarks/serve/bench_serve.py --configs clip_flash --workloads captions64 --no-wrk --photos $root/.device/photos --rates 1500,1560,1620,1700 --duration 8 --results $R/serve_$1; grep -E "^\| *1,[5-7][0-9]0" $R/serve_$1/serve_bench.md | cut -d'|' -f2-9 | head -4; grep -E "Ready after" $R/serve_$1/serve_bench.md | head -1 | cut -c1-200; }
text buckets16_a 16; text buckets8_a 8
serve new_a $root $new; serve var_a $root/.var_tree $var; serve new_b $root $new
pack; echo "all done at $(( $(date +%s) - start )) s"
