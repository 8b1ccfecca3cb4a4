#!/usr/bin/env bash
# Two H200s, this tree at REV (literal full hash): the serving GPU tests (pytest -m gpu tests/serve, two GPUs
# present), the engine-process tests, and `clip-flash serve --devices 0,1` with a checkpoint that cannot load.
rev=$1; R=/tmp/rva; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_va.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])" >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_va.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
echo "not a checkpoint" > /tmp/not_a_checkpoint.pt
run gpu_tests_serve 240 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve
run engine_processes 150 python3 -m pytest -q -rs -p no:cacheprovider tests/serve/test_engine_processes.py
run bad_checkpoint_two_gpus 120 python3 -m clip_flash.serve --model ViT-B-32::/tmp/not_a_checkpoint.pt --devices 0,1 --port 8311
pack; echo "all done at $(( $(date +%s) - start )) s"
