"""libjpeg-turbo's fancy upsampling and colour conversion, redone in torch for nvJPEG's output.

The upsampling and conversion are checked exactly against libjpeg-turbo itself (through Pillow) on JPEGs
whose chroma planes are known; the recovery of the planes from nearest-upsampled RGB (what torchvision's
nvJPEG path returns) is checked on real photos with nvJPEG's upsampling simulated.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from clip_flash.inputs.image.gpu_jpeg import _refine_chroma
from clip_flash.inputs.image.image_decoding import EncodedJpeg
from clip_flash.inputs.image.jpeg_chroma import fancy_upsample, refine_nearest_chroma, ycc_to_rgb
from photo_corpus import skimage_photo

SAMPLINGS = {2: (2, 2), 1: (2, 1)}  # Pillow's subsampling= / get_sampling -> (horizontal, vertical)


def libjpeg_planes(data: bytes) -> np.ndarray:
    """libjpeg-turbo's own Y, upsampled Cb, upsampled Cr (Pillow's draft to YCbCr skips the colour step)."""
    image = Image.open(io.BytesIO(data))
    image.draft("YCbCr", image.size)
    return np.asarray(image).astype(np.int64)


@pytest.mark.parametrize("size", [(160, 96), (150, 90), (147, 85)])
@pytest.mark.parametrize("sampling", [2, 1])
def test_upsampling_and_colour_match_libjpeg_turbo(size, sampling):
    """Colours constant over each chroma block: the decoded chroma planes are those constants (quality 100),
    so libjpeg-turbo's interpolation across block edges and its YCbCr -> RGB can be compared exactly."""
    width, height = size
    horizontal, vertical = SAMPLINGS[sampling]
    block_w, block_h = 8 * horizontal, 8 * vertical
    rng = np.random.default_rng(sampling)
    colours = rng.integers(0, 256, (-(-height // block_h), -(-width // block_w), 3), dtype=np.uint8)
    pixels = np.repeat(np.repeat(colours, block_h, 0), block_w, 1)[:height, :width]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=100, subsampling=sampling)
    data = buffer.getvalue()
    planes = libjpeg_planes(data)
    chroma_h, chroma_w = -(-height // vertical), -(-width // horizontal)
    for channel in (1, 2):
        # Each chroma block's value, read at its block's centre, spread over the block.
        centres = planes[np.minimum(np.arange(colours.shape[0]) * block_h + block_h // 2, height - 1)][
            :, np.minimum(np.arange(colours.shape[1]) * block_w + block_w // 2, width - 1), channel]
        raw = torch.from_numpy(np.repeat(np.repeat(centres, 8, 0), 8, 1)[:chroma_h, :chroma_w].copy())
        upsampled = fancy_upsample(raw, horizontal, vertical)[:height, :width]
        assert torch.equal(upsampled, torch.from_numpy(planes[:, :, channel]))
    rgb = ycc_to_rgb(*(torch.from_numpy(planes[:, :, channel].copy()) for channel in range(3)))
    assert np.array_equal(rgb.numpy(), np.asarray(Image.open(io.BytesIO(data))))


def simulated_nvjpeg(planes: torch.Tensor, horizontal: int, vertical: int):
    """Chroma planes from libjpeg's upsampled ones (block means), then the libjpeg result and nvJPEG's
    (chroma repeated per block) of the very same planes."""
    height, width = planes.shape[:2]
    raw = []
    for channel in (1, 2):
        plane = planes[:, :, channel].float()[None, None]
        plane = F.pad(plane, (0, -width % horizontal, 0, -height % vertical), mode="replicate")
        raw.append(F.avg_pool2d(plane, (vertical, horizontal))[0, 0].round().long())
    truth = ycc_to_rgb(planes[:, :, 0], *[fancy_upsample(r, horizontal, vertical)[:height, :width] for r in raw])
    nearest = [r.repeat_interleave(vertical, 0).repeat_interleave(horizontal, 1)[:height, :width] for r in raw]
    return truth, ycc_to_rgb(planes[:, :, 0], *nearest)


@pytest.mark.parametrize("sampling", [2, 1])
def test_recovered_chroma_is_close_to_libjpeg_on_real_photos(sampling):
    horizontal, vertical = SAMPLINGS[sampling]
    for name, size in (("astronaut.png", (320, 240)), ("coffee.png", (301, 199)), ("chelsea.png", (450, 300))):
        buffer = io.BytesIO()
        skimage_photo(name).convert("RGB").resize(size).save(buffer, "JPEG", quality=90, subsampling=sampling)
        truth, nearest = simulated_nvjpeg(torch.from_numpy(libjpeg_planes(buffer.getvalue())), horizontal, vertical)
        before = (nearest.int() - truth.int()).abs()
        after = (refine_nearest_chroma(nearest, sampling).int() - truth.int()).abs()
        print(f"{name} {size} sampling {sampling}: pixels differing {100 * (before > 0).float().mean():.1f}% "
              f"-> {100 * (after > 0).float().mean():.2f}%, max {before.max()} -> {after.max()}")
        assert (before > 0).float().mean() > 0.05  # nearest upsampling is far off...
        assert (after > 0).float().mean() < 0.02 and after.float().mean() < 0.05  # ...the recovery is close


def test_batched_refinement_equals_one_by_one():
    images = torch.randint(0, 256, (3, 37, 51, 3), dtype=torch.uint8)
    batched = refine_nearest_chroma(images, 2)
    assert all(torch.equal(batched[index], refine_nearest_chroma(images[index], 2)) for index in range(3))
    assert torch.equal(refine_nearest_chroma(images[0], 0), images[0])  # 4:4:4 is left alone


def _header(index, image_size, sampling):
    """A colour JPEG's item as the CPU step gives it (the refinement reads only its header fields)."""
    return EncodedJpeg(index, torch.empty(0, dtype=torch.uint8), image_size, 3, sampling, False)


def test_refinement_groups_images_by_size_and_sampling():
    shapes = [(40, 30), (40, 30), (20, 30), (40, 30)]
    samplings = [2, 1, 2, 0]
    pairs = []
    for index, ((height, width), sampling) in enumerate(zip(shapes, samplings)):
        item = _header(index, (height, width), sampling)
        pairs.append((item, torch.randint(0, 256, (height, width, 3), dtype=torch.uint8)))
    refined, refused = _refine_chroma(pairs)
    assert refused == []
    for (item, original), (same_item, result) in zip(pairs, refined):
        assert same_item is item
        assert torch.equal(result, refine_nearest_chroma(original, item.jpeg_sampling))


# The web photos' sizes (landscape and portrait, odd heights and widths included), more images of one size
# than a refinement chunk holds: the chroma step's indexing (index_select, table lookups) stays in bounds.
PHOTO_SIZES = [(240, 320), (768, 1024), (375, 500), (500, 375), (333, 500), (427, 640), (481, 641), (1, 1),
               (2, 3), (17, 1)]


def test_refinement_stays_in_bounds_at_photo_sizes(monkeypatch):
    import clip_flash.inputs.image.gpu_jpeg as gpu_jpeg

    monkeypatch.setattr(gpu_jpeg, "REFINE_CHUNK", 3)
    generator = torch.Generator().manual_seed(0)
    pairs = []
    for index, (height, width) in enumerate(PHOTO_SIZES + PHOTO_SIZES[:3] * 2):
        # Extremes too: pure black/white blocks (all channels clipped) and random colours.
        pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
        pixels[: height // 3] = 255 if index % 2 else 0
        item = _header(index, (height, width), 2 if index % 3 else 1)
        pairs.append((item, pixels))
    refined, refused = gpu_jpeg._refine_chroma(pairs)
    assert refused == [] and [item.index for item, _ in refined] == list(range(len(pairs)))
    for (item, original), (_, result) in zip(pairs, refined):
        assert result.shape == original.shape and result.dtype == torch.uint8
        assert torch.equal(result, refine_nearest_chroma(original, item.jpeg_sampling))


def test_a_failing_refinement_chunk_is_refused_not_raised(monkeypatch):
    import clip_flash.inputs.image.gpu_jpeg as gpu_jpeg

    def out_of_memory(rgb, sampling):
        if rgb.shape[1] == 40:
            raise RuntimeError("CUDA out of memory")
        return refine_nearest_chroma(rgb, sampling)

    monkeypatch.setattr(gpu_jpeg, "refine_nearest_chroma", out_of_memory)
    pairs = [(_header(index, (height, 30), 2),
              torch.randint(0, 256, (height, 30, 3), dtype=torch.uint8))
             for index, height in enumerate((40, 20, 40))]
    refined, refused = gpu_jpeg._refine_chroma(pairs)
    assert [item.index for item, _ in refined] == [1]
    assert [item.index for item, _ in refused] == [0, 2]
    assert all("out of memory" in reason for _, reason in refused)


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", [2, 1])
@pytest.mark.parametrize("size", [(480, 640), (61, 97), (1, 1), (2, 3), (375, 500)])
def test_chroma_kernel_matches_the_tensor_ops(sampling, size):
    """The CUDA kernel against the tensor version it replaces, on real photos as nvJPEG decodes them (and
    on noise, for clipped pixels and odd sizes): the same float steps, summed in a possibly different order,
    so a block mean near .5 may round the other way: that block's chroma moves a level, its pixels up to
    three (the colour conversion scales chroma by up to 1.772). Anything else is a bug."""
    from clip_flash.inputs.image.jpeg_chroma import refine_with_tensor_ops
    from clip_flash.ops._extension import load_extension
    from torchvision.io import decode_jpeg

    extension = load_extension()
    if extension is None or not hasattr(extension, "jpeg_chroma"):
        pytest.skip("clip_flash._C with jpeg_chroma is not built")
    height, width = size
    frames = []
    for name in ("astronaut.png", "coffee.png", "chelsea.png"):
        buffer = io.BytesIO()
        skimage_photo(name).convert("RGB").resize((width, height), Image.BICUBIC).save(
            buffer, "JPEG", quality=90, subsampling=sampling)
        encoded = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        frames.append(decode_jpeg(encoded, device="cuda").permute(1, 2, 0).contiguous())
    generator = torch.Generator(device="cuda").manual_seed(sampling)
    noise = torch.randint(0, 256, (height, width, 3), generator=generator, device="cuda", dtype=torch.int32)
    frames.append(noise.to(torch.uint8))
    batch = torch.stack(frames)
    kernel = refine_nearest_chroma(batch, sampling)
    reference = refine_with_tensor_ops(batch, sampling)
    single = refine_nearest_chroma(batch[0], sampling)
    assert kernel.shape == reference.shape and kernel.dtype == torch.uint8
    difference = (kernel.int() - reference.int()).abs()
    assert difference.max().item() <= 3
    assert (difference > 0).float().mean().item() < 5e-3
    assert torch.equal(single, kernel[0])


@pytest.mark.gpu
def test_packed_chroma_kernel_equals_the_one_size_kernel():
    """The packed launch (images of any size and sampling anywhere in one buffer, refined in place) gives
    each image exactly what the one-size kernel gives it, and leaves the bytes between images alone."""
    from clip_flash.ops._extension import load_extension

    extension = load_extension()
    if extension is None or not hasattr(extension, "jpeg_chroma_packed"):
        pytest.skip("clip_flash._C with jpeg_chroma_packed is not built")
    generator = torch.Generator(device="cuda").manual_seed(0)
    sizes = [(480, 640), (1, 1), (61, 97), (2, 3), (375, 500), (97, 61), (768, 1024)]
    samplings = [2, 1, 2, 2, 1, 1, 2]
    images, rows, offset = [], [], 7  # an odd start: offsets need no alignment
    for (height, width), sampling in zip(sizes, samplings):
        images.append(torch.randint(0, 256, (height, width, 3), generator=generator, device="cuda",
                                    dtype=torch.int32).to(torch.uint8))
        rows.append((offset, height, width, *SAMPLINGS[sampling]))
        offset += height * width * 3 + 5  # a gap after each image
    buffer = torch.full((offset,), 77, dtype=torch.uint8, device="cuda")
    for image, row in zip(images, rows):
        buffer[row[0]:row[0] + image.numel()] = image.reshape(-1)
    untouched = torch.ones(offset, dtype=torch.bool, device="cuda")
    assert extension.jpeg_chroma_packed(buffer, torch.tensor(rows, dtype=torch.int64)) == ""
    for image, row, sampling in zip(images, rows, samplings):
        got = buffer[row[0]:row[0] + image.numel()].view(image.shape)
        assert torch.equal(got, refine_nearest_chroma(image, sampling)), (row, sampling)
        untouched[row[0]:row[0] + image.numel()] = False
    assert (buffer[untouched] == 77).all()


@pytest.mark.gpu
def test_packed_chroma_kernel_refuses_slots_outside_the_buffer():
    """Bad arguments come back as the reason, and nothing is written (the call runs without the GIL)."""
    from clip_flash.ops._extension import load_extension

    extension = load_extension()
    if extension is None or not hasattr(extension, "jpeg_chroma_packed"):
        pytest.skip("clip_flash._C with jpeg_chroma_packed is not built")
    buffer = torch.zeros(64, dtype=torch.uint8, device="cuda")

    def refusal(pixels, row):
        return extension.jpeg_chroma_packed(pixels, torch.tensor([row], dtype=torch.int64))

    for row in [(62, 1, 1, 2, 2), (-1, 1, 1, 2, 2), (0, 0, 4, 2, 1)]:
        assert "outside the buffer" in refusal(buffer, row)
    assert "chroma factors" in refusal(buffer, (0, 2, 2, 1, 1))
    assert "CUDA uint8" in refusal(buffer.cpu(), (0, 2, 2, 2, 2))
    assert (buffer == 0).all()
