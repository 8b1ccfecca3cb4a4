#!/usr/bin/env bash
# At REV: the native decoder's and the split's tests; one JPEG to a ViT-L-14 embedding split and on one thread.
rev=$1; R=/tmp/rx; rm -rf $R; mkdir -p $R/latency; start=$(date +%s)
timeout 60 python3 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_native_decoder.py tests/inputs/test_jpeg_entropy_split.py > $R/gpu_tests_native_decoder_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_native_decoder_$rev.log
tail -2 $R/gpu_tests_native_decoder_$rev.log; echo "tests done at $(( $(date +%s) - start )) s"
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
timeout 110 python3 benchmarks/image_latency.py --photos /tmp/photos --model ViT-L-14 --requests 1000 --json $R/latency/image_latency.json --markdown $R/latency/image_latency.md > $R/latency/latency.log 2>&1; echo "rc=$?" >> $R/latency/latency.log
head -12 $R/latency/image_latency.md | tail -4; grep -E "entropy decode to" $R/latency/image_latency.md; echo "latency done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_x.tgz . )
