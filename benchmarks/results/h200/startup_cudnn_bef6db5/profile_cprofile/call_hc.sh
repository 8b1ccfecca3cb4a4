#!/usr/bin/env bash
# One H200 at NEW: where the clip_flash server's start-up goes, under cProfile, as it is and with PyTorch's cuDNN
# attention turned off (startup_profile.py).
new=$1; R=/tmp/rhc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_hc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
pack() { ( cd $R && tar -czf $OUT/call_hc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( CLIP_FLASH_GIT_REVISION=$new timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
python3 -c "import torch; print(torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cudnn.version())"
run startup 300 benchmarks/serve/startup_profile.py --model ViT-L-14 --variant as-is no-cudnn-attention --cprofile 30 --results $R/startup
grep -v "^|" $R/startup.log | tail -30; grep -E "^\| (build|patch|torch|capture|time)" $R/startup.log; grep -E "^\| \`" $R/startup.log | head -40
pack; echo "all done at $(( $(date +%s) - start )) s"
