"""Diagnostic: which piece of the patched ViT-L-14 image forward gives other bits call after call."""
import torch, torch.nn.functional as F, open_clip, clip_flash
from torch.nn.attention import SDPBackend, sdpa_kernel
from clip_flash.ops import fused_ops
from open_clip.transformer import VisionTransformer

torch.manual_seed(0)
dev, dt = "cuda", torch.float16

def reps(label, fn, n=8):
    outs = []
    with torch.inference_mode():
        for _ in range(n):
            o = fn(); torch.cuda.synchronize(); outs.append(o.float().cpu().reshape(o.shape[0], -1))
    d = [int((o != outs[0]).any(dim=1).sum()) for o in outs[1:]]
    print(f"{label}: rows differing from call 0: {d}", flush=True)

B, H, L, D = 256, 16, 257, 64
q1 = torch.randn(B, H, 1, D, device=dev, dtype=dt)
kv = torch.randn(B, L, 2 * H * D, device=dev, dtype=dt)
k, v = kv.unflatten(-1, (2, H, D)).transpose(1, 3).unbind(2)
reps("sdpa q=1 default", lambda: F.scaled_dot_product_attention(q1, k, v))
for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
    try:
        with sdpa_kernel(be):
            reps(f"sdpa q=1 {name}", lambda: F.scaled_dot_product_attention(q1, k, v))
    except Exception as e:
        print(f"sdpa q=1 {name}: cannot ({str(e)[:80]})")
try:
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p, torch.inference_mode():
        F.scaled_dot_product_attention(q1, k, v); torch.cuda.synchronize()
    print("default q=1 kernels:", [e.key[:70] for e in p.key_averages() if e.device_time_total > 0][:4])
except Exception as e:
    print("profile failed", e)

x = torch.randn(B * L, 1024, device=dev, dtype=dt); dl = torch.randn_like(x)
w = torch.randn(1024, device=dev, dtype=dt); b = torch.randn(1024, device=dev, dtype=dt)
reps("layer_norm", lambda: fused_ops.layer_norm(x, w, b, 1e-5))
reps("add_layer_norm", lambda: torch.cat(fused_ops.add_layer_norm(x, dl, None, w, b, 1e-5), dim=1))
hx = torch.randn(B * L, 4096, device=dev, dtype=dt)
reps("bias_act gelu", lambda: fused_ops.bias_act(hx, "gelu"))
reps("residual_add", lambda: fused_ops.residual_add(x, dl, None))
W1 = torch.randn(4096, 1024, device=dev, dtype=dt) * 0.03; b1 = torch.randn(4096, device=dev, dtype=dt)
W2 = torch.randn(1024, 4096, device=dev, dtype=dt) * 0.02; b2 = torch.randn(1024, device=dev, dtype=dt)
r = torch.randn(B, 1024, device=dev, dtype=dt); r4 = torch.randn(B, 4096, device=dev, dtype=dt)
reps("linear 256x1024 -> 4096", lambda: F.linear(r, W1, b1))
reps("linear 256x4096 -> 1024", lambda: F.linear(r4, W2, b2))
Wq = torch.randn(1024, 1024, device=dev, dtype=dt) * 0.03
reps("linear 256x1024 -> 1024", lambda: F.linear(r, Wq, b))

model, _, _ = open_clip.create_model_and_transforms("ViT-L-14", precision="fp16", device=dev)
model.eval()
xi = torch.randn(256, 3, 224, 224, device=dev).half()
clip_flash.patch(model)
reps("patched", lambda: model.encode_image(xi), 6)
cls = type(model.visual)
model.visual.__class__ = VisionTransformer  # the last block on every token, fused blocks kept
reps("patched, last block on every token", lambda: model.encode_image(xi), 6)
model.visual.__class__ = cls
with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
    reps("patched, torch's sdpa without cuDNN", lambda: model.encode_image(xi), 6)
