#!/usr/bin/env bash
# At REV (new): GPU tests of the image inputs and the job; then the decode-gpu ViT-B-32 job over 57,600 files,
# REV's parent (old: the resize of the layouts launched by prepare()) against REV (new: queued by the decoding
# thread), exact share 0 and 0.35, alternated old/new.
rev=$1; R=/tmp/rh; mkdir -p $R; start=$(date +%s)
timeout 240 python3 -m pytest -m gpu -q -rs tests/inputs/test_nvjpeg_hardware_gpu.py tests/inputs/test_native_decoder.py tests/inputs/test_exact_share.py tests/inputs/test_images_gpu.py tests/inputs/test_images_lifetime_gpu.py tests/jobs > $R/gpu_tests_inputs_jobs_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_inputs_jobs_$rev.log; tail -4 $R/gpu_tests_inputs_jobs_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
cp -r .device/photos384 /tmp/photos384
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=.device -cf - . | tar -xf - -C /tmp/old
cp .device/old/*.py /tmp/old/clip_flash/inputs/image/ && rm /tmp/old/clip_flash/inputs/image/thread_streams.py
grep -c "_resize_ahead" /tmp/old/clip_flash/inputs/image/preprocessor.py clip_flash/inputs/image/preprocessor.py
job() { # tree name share
  now=$(date +%s); if (( now - start > 540 )); then echo "skip $2 at $((now-start)) s"; return; fi
  ( cd $1 && PYTHONPATH=/tmp/site:$1 timeout 80 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 150 --cases gpu-decode --no-stock --captions 0 --encoder-calls 5 --exact-share $3 --results $R/$2 > $R/$2.log 2>&1 )
  grep -E "ViT-B-32" $R/$2/embed_bench.md | head -2 | cut -d'|' -f4,7,8,9,10,12,13,14; echo "$2 at $(( $(date +%s) - start )) s"
}
job /tmp/old old_share0_a 0; job $PWD new_share0_a 0; job $PWD new_share035_a 0.35; job /tmp/old old_share035_a 0.35
job $PWD new_share035_b 0.35; job /tmp/old old_share035_b 0.35; job /tmp/old old_share0_b 0; job $PWD new_share0_b 0
cd $R && tar -czf $OUT/call_h.tgz .
