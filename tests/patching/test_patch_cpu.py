"""patch() on every OpenCLIP family with native blocks, CPU fp32: same outputs, exact unpatch, clean errors."""
from __future__ import annotations

import copy

import pytest
import torch
from tests.utils import edge_case_tokens, image_size, relative_error

import clip_flash
from clip_flash.patching.residual_block import FlashResidualAttentionBlock

# CI builds the two that cover every kind of site (causal text, vision, cross-attention, attentional pooler); the
# others take tens of seconds each to build on a CPU and run with --run-slow.
FAMILIES = [
    "ViT-B-32",            # classic CLIP
    pytest.param("ViT-B-32-quickgelu", marks=pytest.mark.slow),  # QuickGELU activation
    pytest.param("RN50", marks=pytest.mark.slow),               # ModifiedResNet vision (AttentionPool2d), native text
    pytest.param("convnext_base", marks=pytest.mark.slow),      # timm vision tower with native text
    "coca_ViT-B-32",       # CoCa: causal+pad text mask, decoder cross-attention, attentional pooler
    pytest.param("ViT-B-16-SigLIP", marks=pytest.mark.slow),    # bidirectional text tower
    pytest.param("EVA02-B-16", marks=pytest.mark.slow),         # timm EVA vision, native text
    pytest.param("MobileCLIP-S1", marks=pytest.mark.slow),      # timm FastViT vision, bidirectional text
]


def _tokens(model: torch.nn.Module) -> torch.Tensor:
    text_tower = getattr(model, "text", model)  # CustomTextCLIP/CoCa keep these on the text tower
    return edge_case_tokens(text_tower.context_length, text_tower.vocab_size)


def _images(model: torch.nn.Module, batch: int = 2) -> torch.Tensor:
    size = image_size(model)
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _encode(model, tokens, images):
    with torch.no_grad():
        return model.encode_text(tokens), model.encode_image(images)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: ``torch.equal`` says False for a NaN, and a parameter OpenCLIP never initialises (CoCa's
    ``text_decoder.text_projection``, allocated with ``torch.empty``) holds whatever the allocator reused, NaNs
    included."""
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8)))


@pytest.mark.parametrize("name", FAMILIES)
def test_patched_matches_stock_and_unpatch_is_exact(build_model, name):
    model = build_model(name)
    tokens, images = _tokens(model), _images(model)
    stock_text, stock_image = _encode(model, tokens, images)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    classes_before = [type(m) for m in model.modules()]

    report = clip_flash.patch(model)
    assert report.patched_sites, str(report)
    assert model.state_dict().keys() == state_before.keys()
    changed = [k for k, v in model.state_dict().items() if not _same_bits(v, state_before[k])]
    assert not changed, changed
    text, image = _encode(model, tokens, images)
    assert relative_error(text, stock_text) < 1e-4
    assert relative_error(image, stock_image) < 1e-4

    # Patching twice equals patching once.
    again = clip_flash.patch(model)
    assert str(again) == str(report)
    text_again, image_again = _encode(model, tokens, images)
    assert torch.equal(text_again, text) and torch.equal(image_again, image)

    assert clip_flash.unpatch(model)
    assert [type(m) for m in model.modules()] == classes_before
    assert not any(k.startswith("_clip_flash") for m in model.modules() for k in m.__dict__)
    unpatched_text, unpatched_image = _encode(model, tokens, images)
    assert torch.equal(unpatched_text, stock_text) and torch.equal(unpatched_image, stock_image)


def test_report_names_every_kind_of_site(build_model):
    model = build_model("coca_ViT-B-32")
    with clip_flash.patched(model) as report:
        kinds = {(site.tower, site.kind) for site in report.sites}
        data = report.to_dict()
    assert ("text", "causal self-attention") in kinds
    assert ("vision", "self-attention") in kinds
    assert ("vision", "pooler") in kinds
    assert ("decoder", "cross-attention") in kinds
    assert "class token" in data["towers"]["text"]
    assert all({"tower", "block", "kind", "backend", "reason"} <= set(site) for site in data["sites"])


def test_report_gives_the_weights_dtypes_by_their_share(build_model):
    """OpenCLIP's fp16 keeps norms and embeddings (the first parameter among them) in float32: the report names
    the dtypes by their share of the weights, not the first parameter's."""
    model = build_model("ViT-B-32")
    with clip_flash.patched(model) as report:
        assert report.dtype == "float32"
    half = copy.deepcopy(model)
    for module in half.modules():
        if isinstance(module, torch.nn.Linear):
            module.half()
    assert next(half.parameters()).dtype == torch.float32
    with clip_flash.patched(half) as report:
        shares = [part.split() for part in report.dtype.split(" + ")]
    assert [name for name, _ in shares] == ["float16", "float32"], report.dtype
    assert int(shares[0][1].rstrip("%")) > 50 and sum(int(share.rstrip("%")) for _, share in shares) in (99, 100, 101)
    assert f"({report.dtype}, cpu)" in str(report)


def test_foreign_towers_are_reported_not_patched(build_model):
    model = build_model("EVA02-B-16")
    with clip_flash.patched(model) as report:
        vision = [site for site in report.sites if site.tower == "vision"]
        text_backends = report.backends_used()["text"]
    assert len(vision) == 1 and vision[0].backend == "stock" and "timm" in vision[0].reason
    assert text_backends == ["sdpa"]


def test_bidirectional_text_is_not_cut(build_model):
    model = build_model("ViT-B-16-SigLIP")
    with clip_flash.patched(model) as report:
        assert report.towers["text"].startswith("full length")
        assert all(site.kind == "self-attention" for site in report.sites if site.tower == "text")


def test_text_skips_padding_exactly_on_edge_cases(build_model):
    """Packed (reference backend packs on CPU) and cut (SDPA) paths, on rows designed to break them."""
    model = build_model("ViT-B-32")
    tokens = _tokens(model)
    with torch.no_grad():
        stock = model.encode_text(tokens)
        stock_rows = [model.encode_text(tokens[i:i + 1]) for i in range(3)]
        for backend in ("sdpa", "reference"):
            with clip_flash.patched(model, backend) as report:
                assert report.towers["text"].startswith("skips padding")
                assert relative_error(model.encode_text(tokens), stock) < 1e-4
                for i, row in enumerate(stock_rows):  # batch of one
                    assert relative_error(model.encode_text(tokens[i:i + 1]), row) < 1e-4
                odd = tokens[:3]  # an odd batch size
                assert relative_error(model.encode_text(odd), stock[:3]) < 1e-4


def test_text_packing_is_used_and_counts_only_real_tokens(build_model, monkeypatch):
    """The packed path runs on (real tokens, width) matrices: total rows = sum of pooled positions + 1."""
    model = build_model("ViT-B-32")
    tokens = _tokens(model)
    seen = []
    original_attend = FlashResidualAttentionBlock._attend

    def spy(self, h, causal, attn_mask, kv, packing):
        seen.append((tuple(h.shape), packing is not None and causal))
        return original_attend(self, h, causal, attn_mask, kv, packing)

    monkeypatch.setattr(FlashResidualAttentionBlock, "_attend", spy)
    expected_tokens = int((tokens.argmax(dim=-1) + 1).sum())
    with clip_flash.patched(model, "reference"), torch.no_grad():
        model.encode_text(tokens)
    assert seen and all(packed for _, packed in seen)
    assert seen[0][0] == (expected_tokens, model.transformer.width)


def test_packed_calls_run_the_packed_attention_kernel_only_under_auto(build_model, monkeypatch):
    """Under auto, a text block's packed calls go to clip_flash's packed_attention where it takes them (here its
    formula on the CPU stands in for the CUDA kernel), with rows equal to stock's; a named backend keeps its own."""
    from clip_flash.ops.packed_attention import packed_attention_reference
    from clip_flash.patching import residual_block

    model = build_model("ViT-B-32")
    tokens = _tokens(model)
    with torch.no_grad():
        stock = model.encode_text(tokens)
    text_blocks = list(model.transformer.resblocks)
    image_blocks = list(model.visual.transformer.resblocks)
    with clip_flash.patched(model) as report:
        assert all(block._clip_flash_plan.packed_kernel for block in text_blocks)
        assert not any(block._clip_flash_plan.packed_kernel for block in image_blocks)  # never packed
        assert "clip_flash's kernel up to 128 tokens, else" in report.towers["text"], report.towers["text"]
    with clip_flash.patched(model, "sdpa") as report:
        assert not any(block._clip_flash_plan.packed_kernel for block in text_blocks)
        assert "clip_flash's kernel" not in report.towers["text"]

    calls = []

    def kernel(q, k, v, cu_seqlens, max_seqlen, causal):
        calls.append((tuple(q.shape), int(cu_seqlens.shape[0]) - 1, max_seqlen, causal))
        return packed_attention_reference(q, k, v, cu_seqlens, causal)

    monkeypatch.setattr(residual_block, "packed_attention_kernel", kernel)
    with clip_flash.patched(model, "reference"), torch.no_grad():  # the reference backend packs on the CPU
        for block in text_blocks:
            block._clip_flash_plan.packed_kernel = True  # as auto plans it on a GPU
        monkeypatch.setattr(residual_block, "packed_kernel_takes", lambda q, k, v, max_seqlen: True)
        packed = model.encode_text(tokens)
    real_tokens = int((tokens.argmax(dim=-1) + 1).sum())
    assert len(calls) == len(text_blocks)
    assert all(call[0][0] == real_tokens and call[1] == len(tokens) and call[3] for call in calls)
    assert relative_error(packed, stock) < 1e-4


def test_full_length_paths_still_use_causal_flag(build_model):
    """forward_intermediates and output_tokens need every position: they run full length, still exact."""
    model = build_model("ViT-B-32")
    tokens = _tokens(model)
    with torch.no_grad():
        stock = model.forward_intermediates(text=tokens, image=None)["text_features"]
        with clip_flash.patched(model):
            patched_out = model.forward_intermediates(text=tokens, image=None)["text_features"]
    assert relative_error(patched_out, stock) < 1e-4


def test_user_mask_runs_as_explicit_mask(build_model):
    model = build_model("ViT-B-32")
    block = model.transformer.resblocks[0]
    x = torch.randn(3, 10, model.transformer.width)
    bool_like = torch.rand(10, 10) > 0.7
    masks = [
        torch.zeros(10, 10).masked_fill(bool_like, float("-inf")).fill_diagonal_(0),  # 2-D additive
        torch.randn(3 * block.attn.num_heads, 10, 10),  # 3-D (batch * heads) additive
    ]
    with torch.no_grad():
        stock = [block(x, attn_mask=m) for m in masks]
        with clip_flash.patched(model):
            for m, expected in zip(masks, stock):
                assert relative_error(block(x, attn_mask=m), expected) < 1e-4


def test_only_the_given_model_is_patched(build_model):
    model = build_model("ViT-B-32")
    other = copy.deepcopy(model)
    tokens = _tokens(model)
    with torch.no_grad():
        expected = other.encode_text(tokens)
        with clip_flash.patched(model):
            assert type(other.transformer.resblocks[0]).__name__ == "ResidualAttentionBlock"
            assert torch.equal(other.encode_text(tokens), expected)


def test_deepcopy_of_a_patched_model_is_patched_and_independent(build_model):
    model = build_model("ViT-B-32")
    tokens = _tokens(model)
    with torch.no_grad():
        stock = model.encode_text(tokens)
        with clip_flash.patched(model):
            clone = copy.deepcopy(model)
        assert clip_flash.is_patched(clone)
        assert clone.transformer.resblocks[0]._clip_flash_plan.causal_mask_owner is clone
        assert relative_error(clone.encode_text(tokens), stock) < 1e-4
        clip_flash.unpatch(clone)
        assert torch.equal(clone.encode_text(tokens), stock)


@pytest.mark.slow
def test_backward_matches_stock(build_model):
    model = copy.deepcopy(build_model("ViT-B-32")).train()
    tokens, images = _tokens(model)[:4], _images(model, 2)

    def grads():
        model.zero_grad(set_to_none=True)
        text, image = model.encode_text(tokens), model.encode_image(images)
        (text.square().sum() + image.square().sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    stock = grads()
    with clip_flash.patched(model):
        patched = grads()
    assert stock.keys() == patched.keys()
    for name in stock:
        assert relative_error(patched[name], stock[name]) < 1e-3, name


def test_torch_compile_traces_without_graph_breaks(build_model):
    torch._dynamo.reset()
    model = build_model("ViT-B-32")
    tokens, images = _tokens(model), _images(model)
    with torch.no_grad():
        stock_text, stock_image = _encode(model, tokens, images)
        with clip_flash.patched(model):
            # aot_eager traces exactly what inductor would see; fullgraph=True fails on any graph break.
            text = torch.compile(model.encode_text, backend="aot_eager", fullgraph=True)(tokens)
            image = torch.compile(model.encode_image, backend="aot_eager", fullgraph=True)(images)
    torch._dynamo.reset()
    assert relative_error(text, stock_text) < 1e-4
    assert relative_error(image, stock_image) < 1e-4


def test_fp32_model_stays_fp32(build_model):
    model = build_model("ViT-B-32")
    with clip_flash.patched(model), torch.no_grad():
        assert model.encode_text(_tokens(model)).dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in model.parameters())


# -- inputs we cannot serve ------------------------------------------------------------------------------

def test_torchscript_model_is_refused(build_model):
    import warnings

    with warnings.catch_warnings():  # torch 2.11 deprecates torch.jit.script; users may still hand one in
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="TorchScript"):
        clip_flash.patch(scripted)


def test_module_without_openclip_attention_is_refused():
    with pytest.raises(ValueError, match="no OpenCLIP attention"):
        clip_flash.patch(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_unknown_backend_is_refused(build_model):
    with pytest.raises(ValueError, match="unknown attention backend"):
        clip_flash.patch(build_model("ViT-B-32"), backend="triton-magic")


def test_forcing_an_unavailable_backend_names_it_and_leaves_model_untouched(build_model):
    model = build_model("ViT-B-32")
    classes = [type(m) for m in model.modules()]
    with pytest.raises(clip_flash.BackendUnavailableError, match="flash_attn"):
        clip_flash.patch(model, backend="flash_attn")
    assert [type(m) for m in model.modules()] == classes and not clip_flash.is_patched(model)


def test_forced_backend_that_serves_no_site_is_refused(build_model):
    model = build_model("ViT-B-32")  # fp32 on CPU: SDPA's pinned cuDNN kernel serves nothing here
    with pytest.raises(clip_flash.BackendUnavailableError, match="sdpa:cudnn") as refused:
        clip_flash.patch(model, backend="sdpa:cudnn")
    assert not clip_flash.is_patched(model)
    if not torch.cuda.is_available():  # refused for the reason available_backends() gives
        assert clip_flash.available_backends()["sdpa:cudnn"].reason in str(refused.value)


def test_failed_repatch_keeps_the_previous_patch(build_model):
    model = build_model("ViT-B-32")
    with clip_flash.patched(model, "reference") as report:
        with pytest.raises(clip_flash.BackendUnavailableError):
            clip_flash.patch(model, backend="sdpa:cudnn")
        assert clip_flash.patch_report(model) is report


def test_available_backends_explains_what_cannot_run():
    statuses = clip_flash.available_backends()
    assert statuses["sdpa"].available and statuses["reference"].available
    if not torch.cuda.is_available():
        assert not statuses["flash_attn"].available and statuses["flash_attn"].reason
        # What info lists as runnable is what patch() accepts: no pinned CUDA kernel on a CPU-only machine.
        assert statuses["sdpa:math"].available
        for name in ("sdpa:cudnn", "sdpa:flash", "sdpa:efficient"):
            assert not statuses[name].available and "needs a CUDA GPU" in statuses[name].reason


def test_pinned_sdpa_from_many_threads_leaves_the_global_flags_as_they_were():
    """sdpa_kernel() flips process-wide flags: concurrent pins must not leave one behind (a server's threads)."""
    import random
    import threading
    import time

    from clip_flash.backends import get_backend

    flags = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
             torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)
    before = [flag() for flag in flags]
    backends = [get_backend(name) for name in ("sdpa:flash", "sdpa:efficient", "sdpa:cudnn", "sdpa:math", "sdpa")]

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(200):
            with rng.choice(backends)._context():
                time.sleep(rng.random() * 1e-4)  # widen the window between setting and restoring the flags

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [flag() for flag in flags] == before


@pytest.mark.parametrize("pinned", ["cudnn", "flash", "efficient", "math", None])
def test_pinned_flags_are_sdpa_kernels_and_are_restored_after_errors(pinned):
    """clip_flash's lean pin sets exactly the flags sdpa_kernel() sets, and restores them even on errors."""
    import threading

    from torch.nn.attention import sdpa_kernel

    from clip_flash.backends import sdpa as sdpa_module

    flags = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
             torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)
    before = [flag() for flag in flags]
    expected = before
    if pinned is not None:
        with sdpa_kernel([sdpa_module._PINNABLE[pinned]]):
            expected = [flag() for flag in flags]
    with sdpa_module._flags_held(pinned):
        assert [flag() for flag in flags] == expected
    assert [flag() for flag in flags] == before

    with pytest.raises(RuntimeError, match="inside"):
        with sdpa_module._flags_held(pinned):
            raise RuntimeError("inside")
    assert [flag() for flag in flags] == before
    # The lock was released: another thread can take it at once.
    acquired = []

    def take_and_release():
        got = sdpa_module._SDPA_FLAGS_LOCK.acquire(timeout=5)
        acquired.append(got)
        if got:
            sdpa_module._SDPA_FLAGS_LOCK.release()

    thread = threading.Thread(target=take_and_release)
    thread.start()
    thread.join()
    assert acquired == [True]
