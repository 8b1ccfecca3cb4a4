# Device run N: the caption job (ViT-L-14, 400,000 captions) at the session's last code, beside stock.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_n; mkdir -p $R
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1
echo "build $(( $(date +%s) - t0 )) s" >> $R/times.txt
timeout 240 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models --captions 400000 > $R/embed_log.txt 2>&1
echo "captions rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_n.tgz -C /tmp res_n
cat $R/times.txt; grep -E "^\| ViT" $R/embed/embed_bench.md | cut -c1-200
