#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the patch layer's GPU tests, and the patch report of OpenCLIP's
# fp16 ViT-L-14 (random init) as a server's log shows it.
rev=$1; R=/tmp/rvc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_vc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])" >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_vc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_patching 300 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/patching
run report_vit_l14_fp16 120 python3 -c "
import torch, clip_flash
from clip_flash.models import load_model, parse_model_spec
loaded = load_model(parse_model_spec('ViT-L-14'), torch.device('cuda'), 'fp16')
print(clip_flash.patch(loaded.model))"
pack; echo "all done at $(( $(date +%s) - start )) s"
