"""The decoding pool's start: process workers fork from a fork server (spawned where there is none), start in
the background when the preparer is made, and give exactly the thread pool's rows and failures, bad files
included; closing, restarting and closing in the middle of a start all work; start() makes arenas ahead."""
from __future__ import annotations

import io
import multiprocessing
import os
import threading

import pytest
import torch
from PIL import Image

import clip_flash
import clip_flash.inputs.decode_pool as decode_pool
import clip_flash.inputs.worker_processes as worker_processes
import clip_flash.inputs.pixel_arena as pixel_arena
import clip_flash.ops.image_resample as image_resample_module
from photo_corpus import assert_same_as_reference, skimage_photo


@pytest.fixture(scope="module")
def mixed_inputs(tmp_path_factory, photo_files):
    """Photos as paths and bytes, a PIL image, and every kind of bad file, mixed."""
    folder = tmp_path_factory.mktemp("bad")
    photo = skimage_photo("chelsea.png").convert("RGB")
    encoded = io.BytesIO()
    photo.save(encoded, "JPEG", quality=90)
    jpeg = encoded.getvalue()
    (folder / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 3])
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("not an image at all\n")
    rgba = folder / "rgba.png"  # Pillow resizes it premultiplied: preprocess runs in the worker
    photo.convert("RGBA").resize((150, 90)).save(rgba)
    items = list(photo_files[:14])
    items[3:3] = [str(folder / "truncated.jpg"), str(folder / "missing.jpg"), str(folder / "empty.jpg")]
    items[9:9] = [str(folder / "text.jpg"), jpeg, str(rgba), photo.resize((97, 61))]
    return items


def _same(first, second) -> None:
    assert first.indices == second.indices
    assert first.failures == second.failures
    assert torch.equal(first.pixels, second.pixels)


def test_process_workers_fork_from_the_fork_server(vit_b32_preprocess):
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor="process") as prep:
        assert prep.pool.start_method == worker_processes.process_start_method()
        prep.start(wait=True)
        assert prep.pool.start_seconds is not None  # every worker ran its warm-up decode
        parents = {prep.pool._process_pool().submit(os.getppid).result() for _ in range(4)}
    if "forkserver" in multiprocessing.get_all_start_methods():
        assert prep.pool.start_method == "forkserver"
        assert os.getpid() not in parents  # forked by the server, not started by this process


def test_fork_server_preloads_the_decoding_modules_and_keeps_main():
    from multiprocessing import forkserver

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork server on this platform")
    worker_processes.process_context()
    preload = getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None)
    if preload is None:
        pytest.skip("this Python keeps the fork server's preload list elsewhere")
    assert set(worker_processes.WORKER_MODULES) <= set(preload)
    assert preload[0] == "__main__"  # the default stays first: the main script's classes unpickle in workers
    worker_processes.prestart()  # returns at once; the server imports in its own process
    worker_processes.prestart()


LIGHT_WORKER_SCRIPT = """
import sys
import clip_flash
from clip_flash.inputs.worker_processes import process_context

assert "open_clip" in sys.modules  # the parent has the whole API
context = process_context()
if context.get_start_method() != "forkserver":
    print("no fork server")
    sys.exit(0)
heavy = ("sorted(__import__('sys').modules.keys() & "
         "{'open_clip', 'torchvision', 'clip_flash.inputs.worker_processes'})")
with context.Pool(1) as pool:
    print(pool.apply(eval, (heavy,)))
    # A worker that does use the top-level API gets it on first use.
    print(pool.apply(eval, ("__import__('clip_flash').patch.__module__",)))
# A preparer's workers, after their warm-up and a batch of JPEGs: OpenCLIP's transform was sent to them, but
# unpickling it would import OpenCLIP, and they have not needed it.
import io
import open_clip
import torch
from PIL import Image
_, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32")
jpeg = io.BytesIO()
Image.new("RGB", (64, 48), (200, 30, 90)).save(jpeg, "JPEG")
with clip_flash.ImagePreprocessor(preprocess, device="cpu", dtype=torch.float32, workers=1,
                                  executor="process") as prep:
    prep.start(wait=True)
    assert len(prep([jpeg.getvalue()] * 3)) == 3
    print(prep.pool._process_pool().submit(eval, "'open_clip' in __import__('sys').modules").result())
"""


def test_workers_import_the_decoding_modules_without_open_clip():
    """The fork server (started in a fresh interpreter, as a job starts it) preloads the decoding modules but
    not OpenCLIP (nor torchvision where there is a GPU), which took 14-17 s to import on the GPU host while
    threads stood in; a preparer's workers decode JPEGs without importing OpenCLIP."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LIGHT_WORKER_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if done.stdout.strip() == "no fork server":
        pytest.skip("no fork server on this platform")
    loaded, patch_module, preparer_worker_has_open_clip = done.stdout.strip().splitlines()[-3:]
    # torchvision only without a GPU, where its decoder takes every JPEG (with one, the GPU route does).
    expected = ["clip_flash.inputs.worker_processes"] + ([] if torch.cuda.is_available() else ["torchvision"])
    assert loaded == str(expected)
    assert patch_module == "clip_flash.patching.patching"
    assert preparer_worker_has_open_clip == "False"


def test_prestarted_processes_give_the_thread_pools_rows_and_failures(vit_b32_preprocess, mixed_inputs):
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor="thread", start=False) as threads:
        expected = threads(mixed_inputs)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor="process") as processes:  # started in the background here
        processes.start(wait=True)  # the processes decode, not the threads standing in until they are up
        got = processes(mixed_inputs)
        assert processes.executor == "process"
    _same(got, expected)
    assert len(got.failures) == 4 and len(got.indices) == len(mixed_inputs) - 4
    reasons = dict(got.failures)
    assert "FileNotFoundError" in reasons[4] and "UnidentifiedImageError" in reasons[5]
    assert_same_as_reference(got, vit_b32_preprocess, mixed_inputs)


def test_threads_decode_until_the_processes_are_up(vit_b32_preprocess, mixed_inputs, monkeypatch):
    """A first batch does not wait for the workers' start: the threads decode it, with the same rows."""
    release = threading.Event()
    warm_up = decode_pool.DecodePool._warm_up

    def held_warm_up(pool, threads, processes):
        assert release.wait(60)
        warm_up(pool, threads, processes)

    monkeypatch.setattr(decode_pool.DecodePool, "_warm_up", held_warm_up)
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor="process") as prep:
        early = prep(mixed_inputs)
        assert not prep.pool._processes_ready()
        release.set()
        prep.start(wait=True)
        assert prep.pool._processes_ready()
        late = prep(mixed_inputs)
    _same(early, late)
    assert_same_as_reference(early, vit_b32_preprocess, mixed_inputs)


def test_close_restart_and_close_during_the_start(vit_b32_preprocess, mixed_inputs):
    items = mixed_inputs[:10]
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor="thread", start=False) as threads:
        expected = threads(items)
    prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                        executor="process")
    prep.close()  # most likely while the workers are still starting: returns, nothing left running
    assert prep.pool._processes is None and prep.pool._starter is None
    _same(prep(items), expected)  # started again on first use
    prep.close()
    prep.close()  # twice is fine
    prep.start(wait=True)
    assert prep.pool.start_seconds is not None
    _same(prep(items), expected)
    prep.start()  # already started: nothing new
    _same(prep(items), expected)
    prep.close()


@pytest.fixture
def emulated_kernel(monkeypatch):
    from test_image_resample_packing import EmulatedExtension

    monkeypatch.setattr(image_resample_module, "load_extension", lambda: EmulatedExtension(4096))


@pytest.mark.skipif(not pixel_arena.arenas_supported(), reason="pixel arenas need Linux memfd")
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_start_makes_arenas_the_first_batches_use(vit_b32_preprocess, emulated_kernel, mixed_inputs, executor):
    items = mixed_inputs[:12]
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor=executor) as prep:
        prep.resize.implementation = "kernel"  # the GPU's route, the kernel emulated on the CPU
        prep.start(batch_size=len(items), arenas=2, wait=True)
        reserved = list(prep._arenas._free)
        assert len(reserved) == 2
        assert all(arena.size >= len(items) * prep._arenas.bytes_per_image for arena in reserved)
        decoded = prep.decode(items)
        assert decoded.packed.lease.arena in reserved
        prepared = prep.prepare(decoded)
        assert_same_as_reference(prepared, vit_b32_preprocess, items)
        prep.start(batch_size=len(items), arenas=2, wait=True)  # enough free arenas already: none made
        assert len(prep._arenas._free) <= 2


def test_a_pil_only_batch_never_starts_processes_it_does_not_need(vit_b32_preprocess):
    images = [Image.new("RGB", (40 + 7 * index, 30), (index * 20, 90, 200)) for index in range(4)]
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      executor="process", start=False) as prep:
        prepared = prep(images)
        assert prep.pool._processes is None  # in-memory inputs stay in this process
    assert_same_as_reference(prepared, vit_b32_preprocess, images)


@pytest.mark.skipif(not pixel_arena.arenas_supported(), reason="pixel arenas need Linux memfd")
def test_a_lease_waits_for_the_arena_being_made_ahead_instead_of_making_another(monkeypatch):
    import threading
    import time

    made = []
    real_init = pixel_arena.Arena.__init__

    def slow_init(self, size, pin):  # page-locking a large arena takes a while on a GPU machine
        time.sleep(0.3)
        real_init(self, size, pin)
        made.append(self)

    monkeypatch.setattr(pixel_arena.Arena, "__init__", slow_init)
    arenas = pixel_arena.ArenaPool(pin=False)
    reserver = threading.Thread(target=arenas.reserve, args=(4, 2))
    reserver.start()
    time.sleep(0.05)  # the first arena is being made
    lease, _ = arenas.lease(4)  # the first batch, arriving meanwhile
    reserver.join()
    assert lease.arena is made[0]
    assert len(made) == 2  # the two made ahead, none for the lease
    bigger, _ = arenas.lease(4 * 64)  # nothing made ahead fits: made now, without waiting
    assert len(made) == 3 and bigger.arena is made[2]
    del lease, bigger
    arenas.close()


def test_deferred_transform_is_unpickled_on_its_first_call(vit_b32_preprocess):
    import pickle

    from clip_flash.inputs.background_load import DeferredTransform

    image = Image.new("RGBA", (61, 43), (200, 30, 90, 120))
    travelled = pickle.loads(pickle.dumps(DeferredTransform(vit_b32_preprocess)))
    assert travelled._transform is None  # nothing of the transform's modules needed to arrive
    assert torch.equal(travelled(image), vit_b32_preprocess(image))
    again = pickle.loads(pickle.dumps(travelled))  # pickled again after its first call: the same bytes travel
    assert torch.equal(again(image), vit_b32_preprocess(image))
