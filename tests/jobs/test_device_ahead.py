"""The device's first uses made on stand-ins while an image job's model loads (:mod:`clip_flash.jobs.device_ahead`):
the stand-in is the model's own tower cut to one block, only OpenCLIP's built-in configurations are read (no
download), and a failure is logged, never raised."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import open_clip
import pytest
import torch

import clip_flash
from clip_flash.jobs import device_ahead
from clip_flash.jobs.device_ahead import DeviceFirstUses, stand_in_vision_tower, vision_config
from clip_flash.jobs.beside_load_work import device_first_uses


def test_the_vision_configuration_is_openclips_own_for_built_in_models_only(monkeypatch):
    embed_dim, vision, quick_gelu = vision_config("ViT-B-32")
    assert (embed_dim, vision["width"], vision["layers"], vision["patch_size"], quick_gelu) == (512, 768, 12, 32, False)

    def no_download(name):
        raise AssertionError(f"read the configuration of {name}")

    monkeypatch.setattr(open_clip, "get_model_config", no_download)
    assert vision_config("hf-hub:timm/ViT-B-16-SigLIP") is None
    assert vision_config("no-such-model") is None


def test_the_stand_in_is_the_models_tower_with_one_block_patched_as_the_job_patches():
    embed_dim, vision, quick_gelu = vision_config("ViT-B-32")
    torch.manual_seed(0)
    generator_state = torch.get_rng_state()
    tower = stand_in_vision_tower(embed_dim, vision, quick_gelu, "fp32", torch.device("cpu"), patch=True)
    # The model load beside it seeds the generator and draws the random-init weights from it: nothing taken here.
    assert torch.equal(torch.get_rng_state(), generator_state)
    assert len(tower.transformer.resblocks) == 1 and tower.transformer.width == 768
    assert clip_flash.is_patched(tower) and not tower.training
    with torch.inference_mode():
        assert tower(torch.zeros(2, 3, 224, 224)).shape == (2, 512)
    assert not clip_flash.is_patched(stand_in_vision_tower(embed_dim, vision, quick_gelu, "fp32", "cpu", patch=False))
    half = stand_in_vision_tower(embed_dim, vision, quick_gelu, "fp16", "cpu", patch=False)  # as OpenCLIP casts
    assert half.conv1.weight.dtype == torch.float16 and half.ln_pre.weight.dtype == torch.float32


@pytest.mark.parametrize("device, pipeline, has_images", [("cpu", "clip_flash", True), ("cuda", "stock", True),
                                                          ("cuda", "clip_flash", False)])
def test_only_clip_flashs_image_runs_on_cuda_make_them(device, pipeline, has_images):
    job = SimpleNamespace(spec=SimpleNamespace(name="ViT-B-32"), precision="fp16", patch=True)
    source = SimpleNamespace(has_images=has_images, has_captions=True)
    assert device_first_uses(job, source, torch.device(device), pipeline, "cpu", 256, None, None) is None


def test_a_failure_is_logged_not_raised(monkeypatch, caplog):
    def broken(name):
        raise RuntimeError("no configuration here")

    monkeypatch.setattr(device_ahead, "vision_config", broken)
    with caplog.at_level(logging.WARNING, logger="clip_flash.jobs.device_ahead"):
        first_uses = DeviceFirstUses("ViT-B-32", torch.device("cpu"), "fp32", 8, True, image_path=False,
                                     decode_threads=2).start()
        first_uses.make_encoder_first_uses()
        first_uses.join()
    assert first_uses.steps == {}
    assert "not made beside the model load: no configuration here" in caplog.text


def test_a_random_init_models_weights_are_the_same_with_stand_ins_built_beside_its_load():
    """The model load seeds torch's generator and draws a random-init model's weights from it (as
    ``model_spec.load_model`` does, which the jobs' tests replace with a cache); stand-ins built in another thread
    all the while leave those weights as a load alone makes them."""
    import threading

    from .job_helpers import MODEL

    def random_init_load():
        torch.manual_seed(0)
        return open_clip.create_model(MODEL).state_dict()

    alone = random_init_load()
    embed_dim, vision, quick_gelu = vision_config("ViT-B-32")
    building, loaded = threading.Event(), threading.Event()
    built_during_the_load = []

    def build_beside():
        while not loaded.is_set():
            stand_in_vision_tower(embed_dim, vision, quick_gelu, "fp32", "cpu", patch=False)
            if building.is_set():
                built_during_the_load.append(1)
            building.set()

    builder = threading.Thread(target=build_beside, daemon=True)
    builder.start()
    try:
        assert building.wait(timeout=60)
        beside = random_init_load()
    finally:
        loaded.set()
        builder.join()
    assert built_during_the_load, "no stand-in was built during the load"
    for name, tensor in alone.items():
        assert torch.equal(tensor, beside[name]), name
