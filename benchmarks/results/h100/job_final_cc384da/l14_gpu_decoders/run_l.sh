# Device run L: ViT-L-14 --decode gpu with one hardware decoder vs two (the default since 4ac9a84), alternated:
# run K found it 5.6% slower than at 8af2b4f (2,542 -> 2,398 img/s).
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_l; mkdir -p $R
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
job() {  # $1 label, $2 decoders
  CLIP_FLASH_NVJPEG_DECODERS=$2 timeout 60 python3 scripts/embed.py --model ViT-L-14 --input .device/photos \
    --out /tmp/out_$1 --decode gpu --repeat 20 --shard-size 2048 --no-progress > $R/embed_gpu_l14_$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
  cp /tmp/out_$1/_clip_flash/runs/*.json $R/run_record_l14_$1.json 2>/dev/null; rm -rf /tmp/out_$1
  tar czf $OUT/res_l.tgz -C /tmp res_l
}
job d1_a 1; job d2_a 2; job d1_b 1; job d2_b 2; job d1_c 1; job d2_c 2
cat $R/times.txt
for f in $R/embed_gpu_*.log; do echo "$(basename $f): $(grep -o '[0-9,.]* items/s after the first shard' $f)"; done
