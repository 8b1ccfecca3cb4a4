"""Experiment: nvJPEG queued by prepare() on the calling (main) thread instead of by decode() ahead."""
import os, runpy, sys
sys.path.insert(0, ".")
if os.environ.get("SWITCH"):
    sys.setswitchinterval(float(os.environ["SWITCH"]))
import clip_flash.inputs.images as im
if os.environ.get("NVJPEG_IN") == "prepare":
    def decode(self, items):
        return self._cpu_step(list(items))
    original = im.ImagePreprocessor.prepare
    def prepare(self, decoded):
        jpeg_items = [item for item in decoded.items if item.encoded is not None]
        if jpeg_items and decoded.on_gpu is None:
            pack = self.resize.pack_on_device if self.resize.implementation == "kernel" else None
            decoded.on_gpu = im.decode_jpegs_on_gpu(jpeg_items, self.device, self.gpu_chroma, pack)
        return original(self, decoded)
    im.ImagePreprocessor.decode = decode
    im.ImagePreprocessor.prepare = prepare
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
