"""The hardware route (:mod:`clip_flash.inputs.image.nvjpeg_packed`): nvJPEG's hardware decoder writes torchvision's
pixels straight into the resize kernel's layout, the chroma step runs in place there, and the fast path's
output is the same with the route on or off."""
from __future__ import annotations

import pytest
import torch

import clip_flash
from clip_flash.inputs.image import nvjpeg_packed
from clip_flash.inputs.image.image_decoding import EncodedJpeg
from clip_flash.inputs.image.jpeg_chroma import refine_nearest_chroma

# GPUs with hardware JPEG decoders (A100, H100/H200): there the route must run.
HARDWARE_DECODER_CAPABILITIES = ((8, 0), (9, 0))


def _fast(preprocess, **options):
    return clip_flash.ImagePreprocessor(preprocess, device="cuda", dtype=torch.float32, decode="gpu",
                                        executor="thread", workers=2, **options)


def _jpeg_items(preprocess, paths):
    with _fast(preprocess, nvjpeg_hardware=False) as prep:
        decoded = prep.decode(list(paths))
    return [item for item in decoded.items if isinstance(item, EncodedJpeg)], prep.resize.spec


def _skip_without_hardware():
    """Skip where nvJPEG's hardware decoder turned out unavailable (never on a GPU that has one)."""
    if nvjpeg_packed._HARDWARE["unavailable"] is not None:
        assert torch.cuda.get_device_capability() not in HARDWARE_DECODER_CAPABILITIES, nvjpeg_packed._HARDWARE
        pytest.skip(f"no hardware JPEG decoder here: {nvjpeg_packed._HARDWARE['unavailable']}")


def _packed_or_skip(items, spec, chroma, decoders=nvjpeg_packed.HARDWARE_DECODERS):
    device = torch.device("cuda", torch.cuda.current_device())
    packed = nvjpeg_packed.decode_into_layout(items, device, spec, chroma, decoders)
    _skip_without_hardware()
    assert packed is not None
    torch.cuda.synchronize()
    return packed


@pytest.mark.gpu
@pytest.mark.parametrize("chroma", ["nvjpeg", "libjpeg"])
def test_slots_hold_torchvisions_pixels(vit_b32_preprocess, photo_files, chroma):
    """Each written slot holds torchvision's hardware-decoded pixels (with ``libjpeg``, refined by the
    one-size kernel: the packed launch computes the same); progressive and grayscale JPEGs stay out."""
    from torchvision.io import decode_jpeg

    items, spec = _jpeg_items(vit_b32_preprocess, photo_files)
    assert any(item.jpeg_progressive for item in items) and any(item.channels == 1 for item in items)
    packed = _packed_or_skip(items, spec, chroma)
    assert [item.index for item in packed.items] == [item.index for item in items if nvjpeg_packed.takes(item)]
    assert len(packed.decoded) == len(packed.items) >= 20
    for position in packed.decoded:
        item = packed.items[position]
        reference = decode_jpeg(item.encoded, device="cuda").permute(1, 2, 0).contiguous()
        if chroma == "libjpeg":
            reference = refine_nearest_chroma(reference, item.jpeg_sampling)
        got = packed.plan.pixel_slot(packed.buffer, position)
        assert torch.equal(got, reference), f"input {item.index}: max diff {(got.int() - reference.int()).abs().max()}"


@pytest.mark.gpu
@pytest.mark.parametrize("chroma", ["nvjpeg", "libjpeg"])
def test_fast_path_gives_the_same_rows_with_the_route_on_or_off(monkeypatch, vit_b32_preprocess, photo_files,
                                                                 chroma):
    """The whole fast path (JPEGs of every kind, PNGs, bad files) with the route on equals it off."""
    with _fast(vit_b32_preprocess, gpu_chroma=chroma, nvjpeg_hardware=False) as prep:
        off = prep(photo_files)
    with _fast(vit_b32_preprocess, gpu_chroma=chroma) as prep:
        decoded = prep.decode(photo_files)
        _skip_without_hardware()
        # The hardware's rows (and the few other images in the kernel's layout), resized by the decoding thread.
        assert decoded.ahead is not None and len(decoded.ahead.indices) >= 20
        on = prep.prepare(decoded)
    assert on.indices == off.indices and on.failures == off.failures
    assert torch.equal(on.pixels, off.pixels)


@pytest.mark.gpu
def test_a_bad_file_never_costs_its_neighbours(monkeypatch, vit_b32_preprocess, photo_files):
    """Broken scan data in one JPEG (header intact): the hardware batch fails or leaves it; either way every
    neighbour comes out as with the route off, and the file is a row or a failure as there."""
    paths = [path for path in photo_files if path.suffix == ".jpg"][:12]
    data = [path.read_bytes() for path in paths]
    damaged = bytearray(data[3])
    damaged[len(damaged) // 2:len(damaged) // 2 + 64] = b"\xff" * 64
    data[3] = bytes(damaged)
    with _fast(vit_b32_preprocess) as prep:
        on = prep(data)
    with _fast(vit_b32_preprocess, nvjpeg_hardware=False) as prep:
        off = prep(data)
    assert set(on.indices) >= set(range(len(data))) - {3}
    assert on.indices == off.indices and [index for index, _ in on.failures] == [index for index, _ in off.failures]
    neighbours = [row for row, index in enumerate(on.indices) if index != 3]
    assert torch.equal(on.pixels[neighbours], off.pixels[neighbours])


@pytest.mark.gpu
def test_images_the_transform_cannot_resize_stay_out_of_the_layout(photo_files):
    """``longest`` mode fails on extreme aspect ratios (as OpenCLIP's own transform does): such an image is
    left out of the layout, and its neighbours still go through it."""
    import io

    from open_clip.transform import image_transform
    from PIL import Image

    preprocess = image_transform(224, is_train=False, resize_mode="longest")
    strip = io.BytesIO()
    Image.new("RGB", (2000, 2), "red").save(strip, "JPEG")
    paths = [path for path in photo_files if path.suffix == ".jpg"][:6]
    inputs = [strip.getvalue()] + [path.read_bytes() for path in paths]
    with _fast(preprocess) as prep:
        decoded = prep.decode(inputs)
        _skip_without_hardware()
        # The decoding thread resized what the hardware decoded into ``ahead``: the strip is not among those rows.
        assert decoded.ahead is not None and decoded.ahead.indices and 0 not in decoded.ahead.indices
        prepared = prep.prepare(decoded)
    assert [index for index, _ in prepared.failures] == [0]
    assert set(prepared.indices) == set(range(1, len(inputs)))


@pytest.mark.gpu
def test_a_missing_library_is_a_clear_error_not_a_crash(tmp_path):
    """The call says what it cannot do, from where the GIL is released, without crashing the process: a fresh
    one, as the library is opened once per process."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import torch
        from clip_flash.ops._extension import load_extension
        extension = load_extension()
        out = torch.empty(16, dtype=torch.uint8, device="cuda")
        written, failure = extension.nvjpeg_hw_decode([torch.zeros(4, dtype=torch.uint8)], out, [0, 1, 1],
                                                      {str(tmp_path / "libnvjpeg.so.0")!r})
        print("written:", written, "failure:", failure)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "written: [0] failure: nvJPEG unavailable: " in done.stdout
    assert "cannot open" in done.stdout or "built without <nvjpeg.h>" in done.stdout


@pytest.mark.gpu
def test_where_the_route_cannot_run_torchvision_decodes_everything(monkeypatch, vit_b32_preprocess,
                                                                   photo_files):
    """A GPU without a hardware decoder: the first batch learns it, says so once, and gives the same rows."""
    class NoHardwareDecoder:
        def __getattr__(self, name):
            return getattr(real, name)

        def nvjpeg_hw_decode(self, encoded, *args):
            return [0] * len(encoded), "nvJPEG unavailable: no hardware decoder on device 0 (nvjpegCreateEx status 7)"

    real = nvjpeg_packed.load_extension()
    if real is None or not hasattr(real, "nvjpeg_hw_decode"):
        pytest.skip("clip_flash._C with nvjpeg_hw_decode is not built")
    with _fast(vit_b32_preprocess) as prep:
        reference = prep(photo_files)
    monkeypatch.setattr(nvjpeg_packed, "load_extension", lambda: NoHardwareDecoder())
    monkeypatch.setitem(nvjpeg_packed._HARDWARE, "unavailable", None)
    with _fast(vit_b32_preprocess) as prep:
        decoded = prep.decode(photo_files)
        assert decoded.on_gpu is None and "no hardware decoder" in nvjpeg_packed._HARDWARE["unavailable"]
        assert not nvjpeg_packed.hardware_decoder_usable()
        prepared = prep.prepare(decoded)
    assert prepared.indices == reference.indices and torch.equal(prepared.pixels, reference.pixels)


@pytest.mark.gpu
def test_reading_natively_gives_the_same_rows(vit_b32_preprocess, photo_files):
    """The fast path's default where the extension is built: the native decoder reads the files and scans the
    headers (other formats' pixels beside them); the rows equal those read in Python threads."""
    with _fast(vit_b32_preprocess) as prep:
        threads = prep(photo_files)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, decode="gpu",
                                      workers=2, executor="native") as prep:
        decoded = prep.decode(photo_files)
        assert any(isinstance(item, EncodedJpeg) for item in decoded.items)
        native = prep.prepare(decoded)
    assert native.indices == threads.indices and native.failures == threads.failures
    assert torch.equal(native.pixels, threads.pixels)


@pytest.mark.gpu
def test_batches_decoded_from_several_threads_at_once_are_each_the_same(monkeypatch, vit_b32_preprocess,
                                                                         photo_files):
    """Threads decoding at once (each on its own stream, with its own decoder state) write what one thread
    alone writes, batch for batch."""
    from concurrent.futures import ThreadPoolExecutor

    items, spec = _jpeg_items(vit_b32_preprocess, photo_files)
    items = [item for item in items if nvjpeg_packed.takes(item)]
    batches = [items[start:] + items[:start] for start in range(0, len(items), max(1, len(items) // 8))][:8]
    alone = [_packed_or_skip(batch, spec, "libjpeg", decoders=1) for batch in batches]
    device = torch.device("cuda", torch.cuda.current_device())

    def decode(batch):
        packed = nvjpeg_packed.decode_into_layout(batch, device, spec, "libjpeg", 4)
        packed.ready.synchronize()
        return packed

    with ThreadPoolExecutor(4) as threads:
        for _ in range(3):
            together = list(threads.map(decode, batches))
            for one, other in zip(alone, together):
                assert other.written == one.written and len(one.decoded) >= 20
                for position in one.decoded:
                    assert torch.equal(other.plan.pixel_slot(other.buffer, position),
                                       one.plan.pixel_slot(one.buffer, position)), f"image {position}"


@pytest.mark.gpu
def test_a_decoder_count_out_of_range_is_refused(vit_b32_preprocess, photo_files):
    items, spec = _jpeg_items(vit_b32_preprocess, photo_files)
    _packed_or_skip(items, spec, "nvjpeg")  # skips where the hardware decoder cannot run
    out = torch.empty(16, dtype=torch.uint8, device="cuda")
    for decoders in (0, 9):
        written, failure = nvjpeg_packed.load_extension().nvjpeg_hw_decode(
            [torch.zeros(4, dtype=torch.uint8)], out, [0, 1, 1], nvjpeg_packed._nvjpeg_library(), decoders)
        assert written == [0] and failure == "decoders must be between 1 and 8"


def test_the_decoder_count_argument(vit_b32_preprocess):
    for bad in (0, 9):
        with pytest.raises(ValueError, match="nvjpeg_decoders"):
            clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", nvjpeg_decoders=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("share", [0.5, 1.0])
def test_the_exact_share_is_exact_beside_the_hardwares_rows(vit_b32_preprocess, photo_files, share):
    """decode="gpu" with an exact share: the inputs at the share's positions are decoded exactly (their rows are
    ``preprocess(Image.open(p))`` bit for bit), the others are the rows of the fast path without the share; the
    hardware decodes its part (in a thread of its own) while the CPU decodes the share."""
    from clip_flash.inputs.image.exact_share import exact_positions

    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, workers=4) as prep:
        exact = prep(photo_files)
    native = {"device": "cuda", "dtype": torch.float32, "decode": "gpu", "workers": 4, "executor": "native"}
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, exact_share=0.0, **native) as prep:
        fast = prep(photo_files)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, exact_share=share, **native) as prep:
        decoded = prep.decode(photo_files)
        _skip_without_hardware()
        # Both layouts were resized by the decoding thread (here this one): prepare() only waits for the rows.
        assert decoded.ahead is not None and decoded.on_gpu is None and decoded.packed is None
        mixed = prep.prepare(decoded)
    assert mixed.indices == exact.indices == fast.indices and mixed.failures == exact.failures
    assert mixed.routes.get("jpeg-dct", 0) >= 20 and (share < 1.0) == (mixed.routes.get("gpu-jpeg", 0) > 0)
    on_cpu = set(exact_positions(len(photo_files), share))
    for row, index in enumerate(mixed.indices):
        expected = exact.pixels[row] if index in on_cpu else fast.pixels[row]
        assert torch.equal(mixed.pixels[row], expected), f"input {index} ({'exact' if index in on_cpu else 'nvJPEG'})"
    if share == 1.0:
        assert torch.equal(mixed.pixels, exact.pixels)


@pytest.mark.gpu
@pytest.mark.parametrize("share", [0.0, 0.5])
def test_rows_queued_by_a_decoding_thread_are_waited_for(vit_b32_preprocess, photo_files, share):
    """decode="gpu" queues the resize on the decoding thread's own stream; prepare() on another thread (as the
    job and the server call it) makes its stream wait for them. The decoding thread's stream is kept busy first,
    so that rows read without waiting would not be there yet."""
    from concurrent.futures import ThreadPoolExecutor

    from clip_flash.inputs.image.thread_streams import thread_stream

    native = {"device": "cuda", "dtype": torch.float32, "decode": "gpu", "workers": 4, "executor": "native"}
    device = torch.device("cuda", torch.cuda.current_device())
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, exact_share=share, **native) as prep:
        expected = prep(photo_files)
        if nvjpeg_packed._HARDWARE["unavailable"] is not None:
            pytest.skip(f"no hardware JPEG decoder here: {nvjpeg_packed._HARDWARE['unavailable']}")
        torch.cuda.synchronize()

        def decode_behind_busy_stream():
            with torch.cuda.stream(thread_stream(device)):
                torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time ahead of the resize
            return prep.decode(photo_files)

        with ThreadPoolExecutor(1) as decoding_thread:
            for _ in range(3):
                decoded = decoding_thread.submit(decode_behind_busy_stream).result()
                assert decoded.ahead is not None
                prepared = prep.prepare(decoded)
                del decoded
                assert prepared.indices == expected.indices
                assert torch.equal(prepared.pixels, expected.pixels)
