# Device diagnostic (not committed): where the patched B-32 b64 image call spends CPU time.
import cProfile, pstats, torch, open_clip, clip_flash, copy
m = open_clip.create_model("ViT-B-32", pretrained=None, precision="fp16", device="cuda").eval()
x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.float16)
clip_flash.patch(m)
with torch.inference_mode():
    for _ in range(10): m.encode_image(x)
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(50): m.encode_image(x)
    torch.cuda.synchronize()
    pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
