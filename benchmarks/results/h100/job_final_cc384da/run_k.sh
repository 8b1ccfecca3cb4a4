# Device run K: the final job bench on an H100 (run J ran on an H200): ViT-B-32 and ViT-L-14, stock, exact and
# --decode gpu alternated, at the session's last code.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_k; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1; nvidia-smi > $R/nvidia_smi.txt 2>&1
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 330 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models ViT-B-32 ViT-L-14 --repeat 150 20 --captions 0 --cases exact-processes gpu-decode exact-processes gpu-decode > $R/embed_log.txt 2>&1
echo "embed rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_k.tgz -C /tmp res_k
cat $R/times.txt; grep -E "^\| ViT" $R/embed/embed_bench.md | cut -c1-240
