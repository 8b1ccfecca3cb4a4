#!/usr/bin/env bash
# One H200, NEW against OLD (.old_tree, full shas): the patch's and graphs' GPU tests at NEW; ViT-L-14 caption
# batches through the packed text graphs new/old/new/old; the server at 64 captions a request (1,300-1,700 req/s
# offered for 8 s), fresh servers new then old.
new=$1; old=$2; R=/tmp/rau; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_au.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp clip_flash/_C*.so .old_tree/clip_flash/
CLIP_FLASH_GIT_REVISION=$new timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/patching tests/graphs > $R/gpu_tests_patching_graphs_$new.log 2>&1; tail -n 3 $R/gpu_tests_patching_graphs_$new.log
echo "tests done at $(( $(date +%s) - start )) s"
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_au.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
text() { run text_$1 $2 $3 75 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 $4 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; grep -E "^Encoder alone" $R/text_$1.md | cut -c1-110; }
serve() { run serve_$1 $2 $3 150 benchmarks/serve/bench_serve.py --configs clip_flash --workloads captions64 --no-wrk --photos $root/.device/photos --rates 1300,1500,1700 --duration 8 --results $R/serve_$1; grep -E "^\| *clip_flash" $R/serve_$1/serve_bench.md | head -5; }
text new_a $root $new "--profile-batch 1024"; text old_a $root/.old_tree $old "--profile-batch 1024"
text old_b $root/.old_tree $old ""; text new_b $root $new ""
serve new_a $root $new; serve old_a $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
