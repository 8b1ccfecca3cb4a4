"""A/B: the caption job's rate under sys.setswitchinterval values, in one warm process."""
import sys, time, tempfile, shutil, json
from pathlib import Path
sys.path.insert(0, ".")
import torch, clip_flash
from clip_flash.benchmark.workloads import caption_prompts
n = int(sys.argv[1]); out = sys.argv[2]
scratch = Path(tempfile.mkdtemp())
cap = scratch / "c.txt"; cap.write_text("\n".join(caption_prompts(n, seed=0)) + "\n")
job = dict(device="cuda", shard_size=32768, progress=False)
clip_flash.embed(cap, scratch / "warm", "ViT-L-14", **job)
rows = []
for rep in range(2):
    for interval in (0.005, 0.0005, 0.0001):
        sys.setswitchinterval(interval)
        d = scratch / f"r{rep}_{interval}"
        s = clip_flash.embed(cap, d, "ViT-L-14", **job)
        shutil.rmtree(d)
        rows.append(dict(interval=interval, rep=rep, rate=s.items_per_s, steady=s.steady_items_per_s, summary=s.format()))
        print(interval, rep, round(s.items_per_s), round(s.steady_items_per_s or 0), s.main_thread_seconds, flush=True)
sys.setswitchinterval(0.005)
Path(out).write_text(json.dumps(rows, indent=1))
