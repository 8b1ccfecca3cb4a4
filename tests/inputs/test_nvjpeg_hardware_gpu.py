"""clip_flash's GIL-free nvJPEG call gives torchvision's hardware-decoded pixels, and leaves it the rest."""
from __future__ import annotations

import pytest
import torch

import clip_flash
from clip_flash.inputs import gpu_jpeg
from clip_flash.ops._extension import load_extension

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# GPUs with hardware JPEG decoders (A100, H100/H200): there the call must run.
HARDWARE_DECODER_CAPABILITIES = ((8, 0), (9, 0))


def _jpeg_items(preprocess, paths):
    prep = clip_flash.ImagePreprocessor(preprocess, device="cuda", decode="gpu", workers=2, start=False)
    try:
        decoded = prep._cpu_step(list(paths))
    finally:
        prep.close()
    return [item for item in decoded.items if item.encoded is not None]


@pytest.fixture(autouse=True)
def hardware_call_on(monkeypatch):
    monkeypatch.setenv(gpu_jpeg.HARDWARE_SWITCH, "1")


@cuda
def test_hardware_decode_gives_torchvisions_pixels_and_declines_the_rest(vit_b32_preprocess, photo_files):
    from torchvision.io import decode_jpeg

    extension = load_extension()
    assert extension is not None and hasattr(extension, "nvjpeg_hw_decode")
    device = torch.device("cuda", torch.cuda.current_device())
    items = _jpeg_items(vit_b32_preprocess, photo_files)
    assert len(items) >= 20
    outputs = gpu_jpeg._hardware_decode(items, device)
    if gpu_jpeg._HARDWARE["unavailable"] is not None:
        assert torch.cuda.get_device_capability() not in HARDWARE_DECODER_CAPABILITIES, gpu_jpeg._HARDWARE
        pytest.skip(f"no hardware JPEG decoder here: {gpu_jpeg._HARDWARE['unavailable']}")
    decoded = [(item, pixels) for item, pixels in zip(items, outputs) if pixels is not None]
    declined = [item for item, pixels in zip(items, outputs) if pixels is None]
    assert declined, "the corpus's progressive and grayscale JPEGs are left to torchvision"
    assert len(decoded) >= len(items) // 2 and all(item.channels == 3 for item, _ in decoded)
    assert not any(item.channels == 1 for item, _ in decoded)  # grayscale goes to torchvision
    for item, pixels in decoded:
        reference = decode_jpeg(item.encoded, device=device).permute(1, 2, 0)
        assert pixels.shape == (*item.image_size, 3) and pixels.dtype == torch.uint8
        assert torch.equal(pixels, reference), f"input {item.index}: max diff {(pixels.int() - reference.int()).abs().max()}"
    # What it declines, torchvision decodes: the fast path's whole decode covers every item.
    pairs, refused = gpu_jpeg.decode_on_gpu(items, device)
    torch.cuda.synchronize()
    assert {item.index for item, _ in pairs} | {item.index for item, _ in refused} == {item.index for item in items}
    assert all(pixels.shape == (*item.image_size, item.channels) for item, pixels in pairs)


@cuda
def test_a_bad_file_in_the_hardware_batch_leaves_its_neighbours_to_torchvision(vit_b32_preprocess, photo_files):
    device = torch.device("cuda", torch.cuda.current_device())
    items = _jpeg_items(vit_b32_preprocess, photo_files)[:8]
    damaged = bytearray(items[3].encoded.numpy().tobytes())
    damaged[len(damaged) // 2:len(damaged) // 2 + 64] = b"\xff" * 64  # scan data broken, header intact
    items[3].encoded = torch.frombuffer(damaged, dtype=torch.uint8)
    pairs, refused = gpu_jpeg.decode_on_gpu(items, device)
    torch.cuda.synchronize()
    got = {item.index for item, _ in pairs} | {item.index for item, _ in refused}
    assert got == {item.index for item in items}
    assert {item.index for item, _ in pairs} >= {item.index for item in items} - {items[3].index}
