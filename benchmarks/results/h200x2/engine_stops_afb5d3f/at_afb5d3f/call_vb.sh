#!/usr/bin/env bash
# Two H200s, this tree at REV (literal full hash): the serving GPU tests (pytest -m gpu tests/serve, two GPUs
# present), the engine-process tests, `clip-flash serve --devices 0,1` with a checkpoint that cannot load, and the
# same server (ViT-B-32, random init) with one engine process killed once ready.
rev=$1; R=/tmp/rvb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_vb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])" >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_vb.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
kill_one_engine() {
  python3 -m clip_flash.serve --devices 0,1 --port 8313 &
  local server=$!
  python3 - <<'PY'
import time, httpx
for _ in range(240):
    try:
        r = httpx.get("http://127.0.0.1:8313/ready", timeout=2)
        if r.status_code == 200:
            print("ready:", r.text, flush=True)
            print("embeddings:", httpx.post("http://127.0.0.1:8313/v1/embeddings", json={"input": ["a cat"]}).status_code, flush=True)
            break
    except httpx.TransportError:
        pass
    time.sleep(0.5)
PY
  local engine=""  # an engine process: a child of the server holding the GPU's device files (the frontends do not)
  for child in $(pgrep -P $server); do
    ls -l /proc/$child/fd 2>/dev/null | grep -q /dev/nvidia && engine=$child
  done
  echo "children: $(pgrep -P $server | tr '\n' ' '); killing the engine process $engine"; kill -9 $engine
  wait $server; echo "server exit status $?"
}
export -f kill_one_engine
echo "not a checkpoint" > /tmp/not_a_checkpoint.pt
run gpu_tests_serve 240 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve
run engine_processes 150 python3 -m pytest -q -rs -p no:cacheprovider tests/serve/test_engine_processes.py
run bad_checkpoint_two_gpus 100 python3 -m clip_flash.serve --model ViT-B-32::/tmp/not_a_checkpoint.pt --devices 0,1 --port 8311
run engine_killed_two_gpus 120 bash -c kill_one_engine
pack; echo "all done at $(( $(date +%s) - start )) s"
