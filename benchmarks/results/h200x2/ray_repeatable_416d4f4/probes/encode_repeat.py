"""Diagnostic: is ViT-L-14's fp16 image forward the same bits call after call? By attention backend, and the
exact image preparation of the same files twice."""
import glob, sys
import torch, open_clip, clip_flash
from clip_flash.backends import choosing_for_replay

torch.manual_seed(0)
model, _, preprocess = open_clip.create_model_and_transforms("ViT-L-14", precision="fp16", device="cuda")
model.eval()
x = torch.randn(256, 3, 224, 224, device="cuda").half()
side = torch.cuda.Stream()

def check(label, calls=6, stream=None, replay=False):
    outs = []
    with torch.inference_mode():
        for i in range(calls):
            with torch.cuda.stream(stream or torch.cuda.current_stream()):
                if replay:
                    with choosing_for_replay():
                        outs.append(model.encode_image(x).float().cpu())
                else:
                    outs.append(model.encode_image(x).float().cpu())
            torch.cuda.synchronize()
    diffs = [int((o != outs[0]).any(dim=1).sum()) for o in outs[1:]]
    print(f"{label}: rows differing from call 0: {diffs}", flush=True)

check("stock")
for backend in ("auto", "sdpa:cudnn", "sdpa:efficient", "sdpa:flash"):
    clip_flash.unpatch(model)
    try:
        clip_flash.patch(model, backend=backend)
    except Exception as e:
        print(backend, "cannot:", e); continue
    check(f"{backend}")
    check(f"{backend} side stream", stream=side)
    check(f"{backend} choosing_for_replay", replay=True)
clip_flash.unpatch(model)
clip_flash.patch(model, fuse_blocks=False)
check("auto fuse_blocks=False")
files = sorted(glob.glob(sys.argv[1] + "/*"))[:64] * 4
with clip_flash.ImagePreprocessor(preprocess, device="cuda", dtype=torch.float16) as prep:
    a = prep(files).pixels.cpu(); b = prep(files).pixels.cpu()
print("prepared pixels equal:", torch.equal(a, b), tuple(a.shape), flush=True)
