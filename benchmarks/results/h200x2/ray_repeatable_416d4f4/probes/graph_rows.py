"""Diagnostic: a ViT-L-14 job's image rows with its graph kept against dropped (same inputs, one GPU)."""
import glob, json, sys, time
from pathlib import Path
import numpy as np
import clip_flash
from clip_flash.jobs import warm_up

photos, out = sys.argv[1], Path(sys.argv[2])
warm_up.GRAPH_MIN_BATCHES_LEFT = 0
rows = {}
for mode, share in (("kept", 0.0), ("dropped", 2.0), ("kept2", 0.0)):
    warm_up.GRAPH_LAUNCH_SHARE = share
    t = time.time()
    s = clip_flash.embed(photos, out / mode, "ViT-L-14", repeat=int(sys.argv[3]), progress=False, device="cuda")
    rec = json.loads(open(s.record_path).read())["options"]
    rows[mode] = np.concatenate([np.load(f) for f in sorted(glob.glob(str(out / mode / "img_emb" / "*.npy")))])
    print(mode, "rows", rows[mode].shape, "image_cuda_graphs", rec.get("image_cuda_graphs"), f"{time.time()-t:.1f} s", flush=True)
for a, b in (("kept", "dropped"), ("kept", "kept2")):
    x, y = rows[a].astype(np.float32), rows[b].astype(np.float32)
    diff = np.abs(x - y).max(axis=1)
    bad = np.flatnonzero(diff > 0)
    print(f"{a} vs {b}: {len(bad)} of {len(x)} rows differ, max abs {diff.max():.3g};",
          "batches (256) with a differing row:", sorted(set((bad // 256).tolist()))[:40], flush=True)
