"""The ImagePreprocessor contract on the GPU; the fast path's deviation measured; the encoders take the batch."""
from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import clip_flash
from photo_corpus import assert_same_as_reference, skimage_photo

# Starting a process pool with a worker per core costs seconds per preprocessor: tests about the pixels
# use a few threads; the process pool has its own tests below.
FEW_THREADS = {"workers": 4, "executor": "thread"}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_photo_corpus_on_the_gpu(vit_b32_preprocess, photo_files, dtype):
    """fp32: bit-identical to preprocess(Image.open(p)); fp16/bf16: the reference cast."""
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=dtype, **FEW_THREADS) as prep:
        prepared = prep(photo_files)
    assert prepared.pixels.is_cuda and prepared.pixels.dtype == dtype
    assert_same_as_reference(prepared, vit_b32_preprocess, photo_files, dtype=None if dtype == torch.float32 else dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"resize_mode": "longest"}, {"resize_mode": "squash"},
                                     {"interpolation": "bilinear"}, {"image_size": 336}])
def test_transform_variants_on_the_gpu(options, photo_files):
    import open_clip

    size = options.pop("image_size", 224)
    preprocess = open_clip.image_transform(size, is_train=False, **options)
    with clip_flash.ImagePreprocessor(preprocess, device="cuda", dtype=torch.float32, **FEW_THREADS) as prep:
        assert_same_as_reference(prep(photo_files), preprocess, photo_files)


@pytest.mark.gpu
@pytest.mark.parametrize("executor", ["thread", "native"])
def test_bad_inputs_and_sources_on_the_gpu(vit_b32_preprocess, tmp_path, executor):
    photo = skimage_photo("chelsea.png").convert("RGB")
    buffer = io.BytesIO()
    photo.save(buffer, "JPEG", quality=90)
    good = buffer.getvalue()
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(good[: len(good) // 2])
    good_path = tmp_path / "good.jpg"
    good_path.write_bytes(good)
    items = [good_path, truncated, str(good_path), tmp_path / "missing.jpg", good_path, (tmp_path / "empty.jpg")]
    (tmp_path / "empty.jpg").write_bytes(b"")
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, workers=4,
                                      executor=executor) as prep:
        prepared = prep(items)
        in_memory = prep([good, photo, torch.from_numpy(np.asarray(photo).copy()).cuda()])
    assert_same_as_reference(prepared, vit_b32_preprocess, items)
    assert [index for index, _ in prepared.failures] == [1, 3, 5]
    assert_same_as_reference(in_memory, vit_b32_preprocess, [good, photo, photo])


@pytest.mark.gpu
def test_fast_path_deviation_is_measured(vit_b32_preprocess, photo_files, capsys):
    """decode='gpu' is not exact: print how far each chroma mode is; assert only loose bounds, and that
    recovering the chroma the libjpeg way brings nvJPEG closer to the exact path, not further."""
    std = torch.tensor(vit_b32_preprocess.transforms[-1].std, device="cuda").view(1, 3, 1, 1)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, **FEW_THREADS) as exact:
        reference = exact(photo_files)
    mean_levels = {}
    for chroma in ("nvjpeg", "libjpeg"):
        with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, decode="gpu",
                                          gpu_chroma=chroma, **FEW_THREADS) as fast:
            prepared = fast(photo_files)
        assert prepared.indices == reference.indices and prepared.failures == reference.failures
        assert prepared.routes.get("gpu-jpeg", 0) > 0
        levels = (reference.pixels - prepared.pixels).abs() * std * 255
        mean_levels[chroma] = levels.mean().item()
        with capsys.disabled():
            print(f"\ndecode='gpu', gpu_chroma={chroma!r} vs exact on {len(prepared)} files "
                  f"({prepared.routes.get('gpu-jpeg', 0)} through nvJPEG): max |diff| {levels.max().item():.1f} "
                  f"levels, mean {mean_levels[chroma]:.4f} levels")
        assert mean_levels[chroma] < 5.0
    assert mean_levels["libjpeg"] <= mean_levels["nvjpeg"]


@pytest.mark.gpu
@pytest.mark.parametrize("chroma", ["libjpeg", "nvjpeg"])
def test_fast_path_is_stable_while_the_gpu_is_busy(vit_b32_preprocess, photo_files, chroma):
    """nvJPEG writes its outputs from its own stream: with earlier calls' kernels still queued (behind a
    sleeping kernel here, an encoder in a pipeline), a later call must not overwrite their memory. Before the
    decode ran with a private stream current, this gave an index-out-of-bounds device assert or wrong rows."""
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, decode="gpu",
                                      gpu_chroma=chroma, executor="thread") as fast:
        reference = fast(photo_files)
        torch.cuda.synchronize()
        decoded = [fast.decode(photo_files) for _ in range(3)]
        for _ in range(3):
            torch.cuda._sleep(100_000_000)  # ~50 ms: everything prepared below stays queued behind it
            outputs = [fast.prepare(batch) for batch in decoded]
            torch.cuda.synchronize()
            for prepared in outputs:
                assert prepared.indices == reference.indices
                assert torch.equal(prepared.pixels, reference.pixels)


@pytest.mark.gpu
def test_encoders_take_the_prepared_batch(build_model, vit_b32_preprocess, photo_files):
    """The patched model and GraphedEncoder take PreparedImages.pixels as they are (device, dtype, layout)."""
    model = copy.deepcopy(build_model("ViT-B-32", "fp16", "cuda"))
    clip_flash.patch(model)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float16, **FEW_THREADS) as prep:
        pixels = prep(photo_files[:8]).pixels
    with torch.inference_mode():
        eager = model.encode_image(pixels)
        reference = build_model("ViT-B-32", "fp16", "cuda").encode_image(torch.stack(
            [vit_b32_preprocess(Image.open(path)) for path in photo_files[:8]]).cuda().half())
    encoder = clip_flash.GraphedEncoder(model, batch_sizes=(8,))
    encoder.capture_all()
    graphed = encoder.encode_image(pixels)
    assert F.cosine_similarity(graphed.float(), eager.float()).min().item() > 0.9999
    assert F.cosine_similarity(eager.float(), reference.float()).min().item() > 0.999


def test_patched_model_takes_the_cpu_batch(build_model, vit_b32_preprocess, photo_files):
    """On the CPU the same: fp32 rows straight into the (patched) model, equal to stock on the reference."""
    model = copy.deepcopy(build_model("ViT-B-32"))
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2) as prep:
        pixels = prep(photo_files[:3]).pixels
    reference = torch.stack([vit_b32_preprocess(Image.open(path)) for path in photo_files[:3]])
    with torch.inference_mode():
        stock = model.encode_image(reference)
        with clip_flash.patched(model):
            patched = model.encode_image(pixels)
    assert torch.allclose(patched, stock, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_exact_uploads_overlap_queued_work_without_touching_its_memory(vit_b32_preprocess, photo_files):
    """The exact path uploads on its own stream while the caller's stream is still busy (the encoder of the
    batch before): the upload must neither overwrite memory that queued work still reads nor be read by
    the kernel before it lands. Queued work here: a sleeping kernel, then checks of earlier batches' rows."""
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32,
                                      **FEW_THREADS) as prep:
        reference = prep(photo_files)
        torch.cuda.synchronize()
        decoded = [prep.decode(photo_files) for _ in range(3)]
        for _ in range(3):
            torch.cuda._sleep(100_000_000)  # ~50 ms: the prepares below queue behind it
            outputs = []
            for batch in decoded:
                outputs.append(prep.prepare(batch))
                scratch = torch.empty_like(outputs[-1].pixels).fill_(-7.0)  # reuses freed memory, in stream order
                del scratch
            torch.cuda.synchronize()
            for prepared in outputs:
                assert prepared.indices == reference.indices
                assert torch.equal(prepared.pixels, reference.pixels)
    assert_same_as_reference(reference, vit_b32_preprocess, photo_files)


@pytest.mark.gpu
@pytest.mark.parametrize("executor", ["auto", "thread"])
def test_batches_decoded_ahead_on_the_gpu(vit_b32_preprocess, photo_files, executor):
    """Batches decoded ahead while earlier ones upload, each batch's host memory dropped once prepared (torch's
    page-locked allocator hands it out again only after its copies are done): every batch equals the
    reference (memory rewritten before its upload finished would not)."""
    batches = [photo_files[start::3] for start in range(3)] * 2
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, workers=4,
                                      executor=executor) as prep:
        results = []
        ahead = [prep.decode(batches[0])]
        for number in range(len(batches)):
            if number + 1 < len(batches):
                ahead.append(prep.decode(batches[number + 1]))  # decoded while the previous one uploads
            current = ahead.pop(0)
            results.append(prep.prepare(current))
            current = None  # dropped: its host buffers may serve a later batch once their copies are done
        torch.cuda.synchronize()
    for prepared, paths in zip(results, batches):
        assert_same_as_reference(prepared, vit_b32_preprocess, paths)
