"""The device memory the stand-in's full batch made is the run's: held while the model loads (its weights would
be cut from it), freed by ``join``, and found free by the model's first full batch."""
from __future__ import annotations

import open_clip
import torch

import clip_flash
from clip_flash.jobs import device_ahead
from clip_flash.jobs.device_ahead import DeviceFirstUses

MODEL, BATCH = "ViT-B-32", 256


def _segments_the_first_full_batch_makes() -> "tuple[int, int]":
    """(bytes held while the model loaded, segments the loaded model's first full batch made) in a job's order:
    stand-ins, then the model load, then ``join``, then the first batch."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no memory cached by earlier tests: the stand-in makes its own
    first_uses = DeviceFirstUses(MODEL, torch.device("cuda"), "fp16", BATCH, True, image_path=False,
                                 decode_threads=1).start()
    first_uses._thread.join()  # the stand-in is done before the weights reach the device, as in a long load
    model = open_clip.create_model(MODEL, precision="fp16", device="cuda").eval()
    clip_flash.patch(model)
    first_uses.join()
    segments = torch.cuda.memory_stats()["segment.all.allocated"]
    with torch.inference_mode():
        model.encode_image(torch.zeros(BATCH, 3, 224, 224, dtype=torch.float16, device="cuda"))
    torch.cuda.synchronize()
    return first_uses.held_bytes, torch.cuda.memory_stats()["segment.all.allocated"] - segments


def test_the_first_full_batch_finds_the_memory_the_stand_in_made(monkeypatch):
    held, made = _segments_the_first_full_batch_makes()
    assert held > 0 and made == 0
    # Without the hold the weights take what the stand-in freed, and the first batch makes its own again.
    monkeypatch.setattr(device_ahead, "free_segments_made", lambda *args: [])
    held, made = _segments_the_first_full_batch_makes()
    assert held == 0 and made > 0
