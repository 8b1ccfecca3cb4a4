"""decode="gpu"'s exact share (:mod:`clip_flash.inputs.image.exact_share`): which positions of a batch the CPU
decodes exactly beside nvJPEG's hardware decoder; the preparer's and the job's argument."""
from __future__ import annotations

import pytest

import clip_flash
from clip_flash.inputs.image.exact_share import exact_positions


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 64, 256, 1000])
@pytest.mark.parametrize("share", [0.0, 0.1, 0.25, 1 / 3, 0.35, 0.5, 0.9, 1.0])
def test_positions_are_the_share_spread_evenly(count, share):
    positions = exact_positions(count, share)
    assert positions == sorted(set(positions)) and all(0 <= p < count for p in positions)
    assert abs(len(positions) - count * share) < 1.0
    if len(positions) >= 2 and share <= 0.5:  # evenly spread: no two neighbours, gaps within one of each other
        gaps = [b - a for a, b in zip(positions, positions[1:])]
        assert min(gaps) >= 2 and max(gaps) - min(gaps) <= 1
    assert exact_positions(count, share) == positions  # the same batch, the same rows from run to run


def test_every_prefix_keeps_its_positions():
    """A batch's positions do not depend on what follows it (a shorter last batch takes the same ones)."""
    whole = exact_positions(256, 0.35)
    for count in (1, 5, 100, 255):
        assert exact_positions(count, 0.35) == [p for p in whole if p < count]


@pytest.mark.parametrize("share", [-0.01, 1.01])
def test_a_share_out_of_range_is_refused(share):
    with pytest.raises(ValueError, match="exact share"):
        exact_positions(10, share)


@pytest.mark.parametrize("share", [-0.5, 1.5])
def test_the_preprocessor_refuses_a_share_out_of_range(vit_b32_preprocess, share):
    with pytest.raises(ValueError, match="exact_share"):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", exact_share=share)


def test_the_preprocessor_keeps_its_share(vit_b32_preprocess):
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", workers=2, start=False) as prep:
        assert prep.exact_share == 0.0
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", workers=2, exact_share=0.25,
                                      start=False) as prep:
        assert prep.exact_share == 0.25


def test_the_job_reserves_page_locked_blocks_for_the_exact_images_of_a_batch():
    """The job's page-locked blocks made ahead are sized by the images that take the exact route in a batch."""
    from clip_flash.jobs.beside_load_work import exact_images_per_batch

    assert exact_images_per_batch("cpu", 256, 0.0) == 256
    assert exact_images_per_batch("gpu", 256, 0.0) == 0
    assert exact_images_per_batch("gpu", 256, 0.25) == 64
    assert exact_images_per_batch("gpu", 256, 0.35) == len(exact_positions(256, 0.35)) == 89
