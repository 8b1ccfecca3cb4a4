"""``image_latency.py --host-steps``: the calls are clocked for the run and put back as they were after it."""
from __future__ import annotations

from benchmarks import image_latency
from clip_flash.inputs.image import native_batch
from clip_flash.ops import image_resample


def test_host_steps_clock_each_call_then_restore_it():
    before = {(id(owner), name): vars(owner).get(name) for _, owner, name in image_latency.host_step_targets()}
    spec_shapes = [(480, 640, 3)]

    def request():
        from open_clip.transform import image_transform

        from clip_flash.inputs.image.transform_spec import spec_from_preprocess

        native_batch.plan_batch(spec_shapes, spec_from_preprocess(image_transform(224, is_train=False)))

    times = image_latency.host_step_times(request, requests=3)
    assert set(times) == {"    plan_batch (resize layout)"} and times["    plan_batch (resize layout)"] >= 0
    after = {(id(owner), name): vars(owner).get(name) for _, owner, name in image_latency.host_step_targets()}
    assert after == before
    assert native_batch.plan_batch is image_resample.plan_batch
