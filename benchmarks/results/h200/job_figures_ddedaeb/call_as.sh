#!/usr/bin/env bash
# One H200 at REV (full sha): the job's GPU tests after the job.py split; then issue 27's figures on this host in fresh
# processes: ViT-L-14 exact (7,680 files) x2, ViT-B-32 decode="gpu" (57,600 files) x2 and with exact share 0.35 x2,
# ViT-B-32 exact x1; image preparation alone; one JPEG's latency through GraphedEncoder.
rev=$1; R=/tmp/ras; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_as.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
rm -rf /tmp/photos384 && cp -r .device/photos384 /tmp/photos384
export CLIP_FLASH_GIT_REVISION=$rev
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/jobs/test_job_gpu.py tests/jobs/test_device_ahead.py tests/jobs/test_beside_load.py tests/jobs/test_gpu_decoders_ahead.py tests/jobs/test_pinned_reserve_gpu.py tests/jobs/test_feed_ahead.py tests/jobs/test_beside_load_imports.py > $R/gpu_tests_jobs_$rev.log 2>&1; tail -n 3 $R/gpu_tests_jobs_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_as.tgz . ); }
job() {  # name model repeat case [extra]
  now=$(date +%s); if (( now - start > 520 )); then echo "skip $1"; return; fi
  timeout 90 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models $2 --repeat $3 --cases $4 --no-stock --captions 0 --encoder-calls 5 --results $R/$1 $5 > $R/$1.log 2>&1; echo "rc=$?" >> $R/$1.log
  grep -hE "^\| ViT" $R/$1/*.md | cut -d'|' -f4-14 | tr -s ' '; echo "$1 done at $(( $(date +%s) - start )) s"; pack
}
job exact_l14_a ViT-L-14 20 exact-native
job gpu_b32_a ViT-B-32 150 gpu-decode
job gpu_share_b32_a ViT-B-32 150 gpu-decode "--exact-share 0.35"
job exact_b32_a ViT-B-32 20 exact-native
job gpu_b32_b ViT-B-32 150 gpu-decode
job gpu_share_b32_b ViT-B-32 150 gpu-decode "--exact-share 0.35"
job exact_l14_b ViT-L-14 20 exact-native
now=$(date +%s); if (( now - start < 500 )); then
  timeout 60 python3 benchmarks/image_decode_throughput.py --photos /tmp/photos384 --configs native:16 --jpeg-route on off --batches 12 --json $R/decode.json --markdown $R/decode.md > $R/decode.log 2>&1; tail -n 8 $R/decode.md; pack
fi
now=$(date +%s); if (( now - start < 530 )); then
  timeout $(( 590 - (now - start) )) python3 benchmarks/image_latency.py --photos /tmp/photos384 --model ViT-L-14 --requests 1000 --json $R/image_latency.json --markdown $R/image_latency.md > $R/image_latency.log 2>&1; tail -n 8 $R/image_latency.md
fi
pack; echo "all done at $(( $(date +%s) - start )) s"
