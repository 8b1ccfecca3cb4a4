for m in ViT-B-32 ViT-L-14; do for mode in images library none images library none; do
  python3 .device/probe/probe_warm.py $mode $m 2>/dev/null | tail -1 | tee -a $OUT/probe.jsonl; done; done
