#!/usr/bin/env bash
# One H200 at REV (literal full hash): are the server's host steps slow because the host's cores idle between lone
# requests? image_latency's host-step table with 20 ms idle before each request, asleep and spinning, alternated
# (asleep, spinning, asleep), and what the host says of its CPU (frequency governor, idle states, hypervisor).
rev=$1; R=/tmp/rrb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_rb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
{ lscpu; for f in /sys/devices/system/cpu/cpu0/cpufreq/scaling_{governor,driver,cur_freq,max_freq} \
    /sys/devices/system/cpu/cpuidle/current_{driver,governor}; do echo "$f: $(cat $f 2>&1)"; done
  for d in /sys/devices/system/cpu/cpu0/cpuidle/state*; do echo "$d: $(cat $d/name $d/latency $d/disable 2>&1 | tr '\n' ' ')"; done
  cat /proc/cmdline; } > $R/cpu.txt 2>&1
pack() { ( cd $R && tar -czf $OUT/call_rb.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 1 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
for side in asleep_a spinning_a asleep_b; do
  extra=(); [[ $side == spinning* ]] && extra=(--idle-spin)
  run latency_$side 150 python3 benchmarks/image_latency.py --photos .device/photos --model ViT-L-14 --requests 200 \
      --warmup 30 --host-steps --idle-ms 20 "${extra[@]}" --json $R/latency_$side.json --markdown $R/latency_$side.md
done
pack; echo "all done at $(( $(date +%s) - start )) s"
