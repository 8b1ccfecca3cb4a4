#!/usr/bin/env bash
# At REV: the split entropy decode's tests (extension built), the image inputs' GPU tests, then one JPEG to a
# ViT-L-14 embedding with the entropy decode split and on one thread alternated in one process (image_latency.py).
rev=$1; R=/tmp/rt; rm -rf $R; mkdir -p $R/latency; start=$(date +%s)
grep -q "split" /tmp/build_ext.log && echo "build log mentions split"; ls clip_flash/_C*.so
python3 -c "import clip_flash.ops._extension as e; m=e.load_extension(); print('extension', m is not None and hasattr(m, 'ImageBatchDecoder'))"
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_jpeg_entropy_split.py tests/inputs/test_native_decoder.py tests/inputs/test_jpeg_dct_gpu.py tests/inputs/test_images_gpu.py tests/inputs/test_images_lifetime_gpu.py > $R/gpu_tests_inputs_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_inputs_$rev.log
tail -4 $R/gpu_tests_inputs_$rev.log; echo "tests done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_t_tests.tgz . )
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
timeout 240 python3 benchmarks/image_latency.py --photos /tmp/photos --model ViT-L-14 --requests 1000 --host-steps --json $R/latency/image_latency.json --markdown $R/latency/image_latency.md > $R/latency/latency.log 2>&1; echo "rc=$?" >> $R/latency/latency.log
head -12 $R/latency/image_latency.md | tail -6; grep -i "entropy" $R/latency/image_latency.md; tail -3 $R/latency/latency.log
echo "latency done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_t.tgz . )
