"""A tower's last block computed at the pooled tokens alone (``run_blocks(pooled=...)``): the same rows as the
whole block's output at those tokens, padded or packed, and the MLP of that block run on those rows only;
the vision tower's last block at its class token."""
from __future__ import annotations

import copy

import pytest
import torch
from tests.utils import edge_case_tokens, relative_error

import clip_flash
from clip_flash.patching.residual_block import run_blocks
from clip_flash.patching.vision_tower import FlashVisionTransformer
from open_clip.transformer import VisionTransformer


def _text_blocks(model):
    return list(model.transformer.resblocks)


@pytest.mark.parametrize("causal", [True, False])
def test_pooled_rows_equal_the_whole_blocks_rows_padded(build_model, causal):
    model = build_model("ViT-B-32")
    width = model.transformer.width
    x = torch.randn(5, 77, width, generator=torch.Generator().manual_seed(0))
    pooled = torch.tensor([0, 76, 9, 40, 1])  # the first and the last position among them
    with clip_flash.patched(model), torch.no_grad():
        whole = run_blocks(_text_blocks(model), x, causal=causal)
        rows = run_blocks(_text_blocks(model), x, causal=causal, pooled=pooled)
    assert rows.shape == (5, width)
    assert relative_error(rows, whole[torch.arange(5), pooled]) < 1e-5


@pytest.mark.parametrize("pooled_rows", [5, 3])  # 3: the packing also holds sequences no row pools, as graphs pad
def test_pooled_rows_equal_the_whole_blocks_rows_packed(build_model, pooled_rows):
    model = build_model("ViT-B-32")
    width = model.transformer.width
    lengths = torch.tensor([1, 3, 77, 10, 2])
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    x = torch.randn(int(lengths.sum()), width, generator=torch.Generator().manual_seed(1))
    last = cu_seqlens[1:pooled_rows + 1].long() - 1
    with clip_flash.patched(model, "reference"), torch.no_grad():  # the reference backend packs on the CPU
        whole = run_blocks(_text_blocks(model), x, causal=True, packing=(cu_seqlens, 77))
        rows = run_blocks(_text_blocks(model), x, causal=True, packing=(cu_seqlens, 77), pooled=last)
    assert rows.shape == (pooled_rows, width)
    assert relative_error(rows, whole[last]) < 1e-5


def test_the_last_text_block_runs_its_mlp_on_the_pooled_rows_only(build_model):
    model = build_model("ViT-B-32")
    tokens = edge_case_tokens(model.context_length, model.vocab_size)
    with torch.no_grad():
        stock = model.encode_text(tokens)
    blocks = _text_blocks(model)
    rows_in, hooks = _mlp_rows(blocks)
    try:
        with clip_flash.patched(model), torch.no_grad():
            patched = model.encode_text(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    assert rows_in[len(blocks) - 1] == len(tokens)
    assert all(rows_in[i] > len(tokens) for i in range(len(blocks) - 1))
    assert relative_error(patched, stock) < 1e-5


def _mlp_rows(blocks):
    """Per block, how many rows its MLP's first linear took in the next call (hooks; remove them after)."""
    rows_in = {}
    hooks = [block.mlp.c_fc.register_forward_hook(
        lambda module, args, out, i=i: rows_in.__setitem__(i, args[0].shape[:-1].numel())) for i, block in
        enumerate(blocks)]
    return rows_in, hooks


def test_the_last_vision_block_runs_its_mlp_on_the_class_token_only(build_model):
    model = build_model("ViT-B-32")
    images = torch.randn(3, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        stock = model.encode_image(images)
    blocks = list(model.visual.transformer.resblocks)
    rows_in, hooks = _mlp_rows(blocks)
    try:
        with clip_flash.patched(model) as report, torch.no_grad():
            assert type(model.visual) is FlashVisionTransformer
            assert "last block at the class token alone" in report.towers["vision"], report.towers["vision"]
            patched = model.encode_image(images)
    finally:
        for hook in hooks:
            hook.remove()
    assert type(model.visual) is VisionTransformer  # unpatched
    tokens = model.visual.positional_embedding.shape[0]
    assert rows_in[len(blocks) - 1] == 3 and all(rows_in[i] == 3 * tokens for i in range(len(blocks) - 1))
    assert relative_error(patched, stock) < 1e-5


@pytest.mark.parametrize("change", ["avg pooling", "output tokens"])
def test_a_vision_tower_that_reads_other_tokens_computes_them(build_model, change):
    model = copy.deepcopy(build_model("ViT-B-32"))
    if change == "avg pooling":
        model.visual.pool_type = "avg"
    else:
        model.visual.output_tokens = True
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stock = model.visual(images)
    with clip_flash.patched(model) as report, torch.no_grad():
        assert type(model.visual) is VisionTransformer
        assert "last block on every token (" in report.towers["vision"], report.towers["vision"]
        patched = model.visual(images)
    for got, want in zip(patched if isinstance(patched, tuple) else (patched,),
                         stock if isinstance(stock, tuple) else (stock,)):
        assert relative_error(got, want) < 1e-5


def test_a_vision_tower_set_to_read_every_token_after_patch_computes_them(build_model):
    model = copy.deepcopy(build_model("ViT-B-32"))
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    with clip_flash.patched(model), torch.no_grad():
        assert type(model.visual) is FlashVisionTransformer
        model.visual.output_tokens = True
        pooled, tokens = model.visual(images)
        model.visual.output_tokens = False
    model.visual.output_tokens = True
    with torch.no_grad():
        stock_pooled, stock_tokens = model.visual(images)
    assert relative_error(pooled, stock_pooled) < 1e-5 and relative_error(tokens, stock_tokens) < 1e-5
