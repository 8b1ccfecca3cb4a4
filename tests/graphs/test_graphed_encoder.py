"""GraphedEncoder: eager fallback, bucket choice and staleness detection on the CPU; on a GPU (skipped here),
replayed graphs against eager calls from many threads, copies in and out, re-capture when the model changes,
failed captures, and bounded memory."""
from __future__ import annotations

import contextlib
import copy
import logging
import threading

import open_clip
import pytest
import torch
import torch.nn.functional as F
from tests.utils import assert_within_twice_stock, edge_case_tokens
from torch import nn

import clip_flash
from clip_flash.backends import choosing_for_replay
from clip_flash.graphs import GraphedEncoder
from clip_flash.graphs.capture import GraphKey
from clip_flash.graphs.staleness import _live_watches
from clip_flash.graphs.staleness import tower_watches as _tower_watches
from clip_flash.patching.text_fast_path import encode_pooled_text, pooled_positions

LOGGER = "clip_flash.graphs.encoder"
LENGTHS = (8, 16, 24, 32, 48, 64, 77)


def tiny_clip() -> nn.Module:
    """A two-block CLIP of OpenCLIP's own classes (builds in milliseconds; the text tower is the real 77 x 49408)."""
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=32,
        vision_cfg=dict(layers=2, width=64, head_width=32, patch_size=8, image_size=32),
        text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=2, layers=2),
    )
    return model.eval()


def tokens_ending_at(positions, context_length: int = 77, eot: int = 49407) -> torch.Tensor:
    """One row per position: SOT, filler, EOT at that position, zero padding."""
    rows = torch.zeros(len(positions), context_length, dtype=torch.long)
    for row, position in zip(rows, positions):
        row[: position + 1] = torch.arange(1, position + 2)
        row[0], row[position] = 49406, eot
    return rows


def images_for(model: nn.Module, batch: int, seed: int = 0) -> torch.Tensor:
    size = model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------------
# CPU: fallback, buckets, the captured text function, staleness
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("capture_first", [False, True], ids=["lazy", "capture_all"])
@pytest.mark.parametrize("patched", [True, False], ids=["patched", "stock"])
def test_cpu_model_runs_eager_with_the_reason_logged_once(caplog, patched, capture_first):
    model = tiny_clip()
    if patched:
        clip_flash.patch(model)
    encoder = GraphedEncoder(model)
    images, tokens = images_for(model, 3), edge_case_tokens()
    caplog.set_level(logging.INFO, logger=LOGGER)
    if capture_first:  # the README's order: capture_all(), then the calls
        assert encoder.capture_all().graphs == 0
    with torch.no_grad():
        for normalize in (False, True, False):
            assert torch.equal(encoder.encode_image(images, normalize), model.encode_image(images, normalize))
            assert torch.equal(encoder.encode_text(tokens, normalize), model.encode_text(tokens, normalize))
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 1, [r.getMessage() for r in records]  # one reason, logged once for both towers
    assert records[0].levelno == logging.WARNING and "model is on cpu" in records[0].getMessage()
    stats = encoder.stats()
    assert stats.graphs == 0 and stats.replays == 0 and stats.eager_calls == 6 and stats.graph_memory_bytes == 0
    assert set(stats.no_graphs) == {"image", "text"}
    assert encoder.capture_all().graphs == 0  # nothing to capture on the CPU; not an error


def test_stats_is_a_dict_with_capture_time_graphs_and_memory():
    encoder = GraphedEncoder(tiny_clip())
    stats = encoder.stats()
    assert isinstance(stats, dict)
    for key in ("graphs", "capture_seconds", "total_capture_seconds", "pool_memory_bytes", "graph_memory_bytes",
                "reserved_delta_bytes", "replays", "eager_calls", "invalidations", "failed_captures", "no_graphs"):
        assert key in stats and stats[key] == getattr(stats, key), key
    assert stats["graphs"] == 0 and stats["pool_memory_bytes"] == 0
    with pytest.raises(AttributeError):
        stats.no_such_key


def test_inputs_the_model_cannot_take_raise_clear_errors():
    model = tiny_clip()
    clip_flash.patch(model)
    encoder = GraphedEncoder(model)
    images, tokens = images_for(model, 2), tokens_ending_at([5, 9])
    with torch.no_grad():
        with pytest.raises(ValueError, match="float64"):
            encoder.encode_image(images.double())
        with pytest.raises(ValueError, match="integer"):
            encoder.encode_text(tokens.float())
        with pytest.raises(ValueError, match="meta"):
            encoder.encode_image(torch.empty(2, 3, 32, 32, device="meta"))
        with pytest.raises(ValueError, match="meta"):
            encoder.encode_text(torch.zeros(2, 77, dtype=torch.long, device="meta"))
        with pytest.raises(TypeError):
            encoder.encode_image(images.numpy())
        # Refusals leave the encoder usable.
        assert torch.equal(encoder.encode_image(images), model.encode_image(images))
        assert torch.equal(encoder.encode_text(tokens.int()), model.encode_text(tokens.int()))
    assert encoder.stats().invalidations == 0


def test_batch_buckets():
    encoder = GraphedEncoder(tiny_clip(), batch_sizes=(4, 1, 2, 2))
    assert encoder.batch_sizes == (1, 2, 4)
    assert [encoder.batch_bucket(n) for n in range(7)] == [None, 1, 2, 4, 4, None, None]
    default = GraphedEncoder(tiny_clip())
    assert [default.batch_bucket(n) for n in (1, 2, 3, 5, 9, 16, 17, 32, 33)] == [1, 2, 4, 8, 16, 16, 32, 32, None]
    for bad in ((), (0, 4), (-1,), (1.5,)):
        with pytest.raises(ValueError):
            GraphedEncoder(tiny_clip(), batch_sizes=bad)
    with pytest.raises(TypeError):
        GraphedEncoder(lambda images: images)


def test_length_buckets_follow_the_pooled_positions():
    model = tiny_clip()
    stock_encoder = GraphedEncoder(model)
    assert stock_encoder.length_bucket(tokens_ending_at([3])) == 77  # stock text tower: full length always

    clip_flash.patch(model)
    encoder = GraphedEncoder(model)
    for position in (0, 6, 7, 8, 15, 16, 31, 47, 48, 75, 76):
        expected = min(length for length in LENGTHS if length >= position + 1)
        assert encoder.length_bucket(tokens_ending_at([position])) == expected, position
    assert encoder.length_bucket(tokens_ending_at([2, 40, 9])) == 48  # the batch's longest row decides
    junk = edge_case_tokens()  # includes a row without EOT: argmax pooling reads the largest id, as stock does
    longest = int(pooled_positions(junk, "argmax", None).max()) + 1
    assert encoder.length_bucket(junk) == min(length for length in LENGTHS if length >= longest)

    custom = GraphedEncoder(model, text_lengths=(200, 40, 10))
    assert [custom.length_bucket(tokens_ending_at([p])) for p in (5, 9, 10, 39, 40, 76)] == [10, 10, 40, 40, 77, 77]

    with clip_flash.patched(model, skip_padding=False):
        assert GraphedEncoder(model).length_bucket(tokens_ending_at([3])) == 77


def test_captured_text_function_on_padded_buffers_matches_eager():
    """What a text graph computes, run eagerly on the CPU: the real rows of a zero-initialized static buffer, and of
    one holding earlier rows, equal the model's own encode_text."""
    model = tiny_clip()
    clip_flash.patch(model)
    encoder = GraphedEncoder(model)
    tokens = tokens_ending_at([4, 11, 9])
    with torch.inference_mode():
        expected = model.encode_text(tokens)
        setup = encoder._fresh_setup("text")
        length = encoder.length_bucket(tokens)
        key = GraphKey("text", encoder.batch_bucket(3), (77,), torch.long, length)
        shape, function = encoder._graphed_function(setup, key)
        static = torch.zeros(shape, dtype=torch.long)
        static[:3] = tokens
        torch.testing.assert_close(function(static)[:3], expected, rtol=1e-5, atol=1e-6)
        static[3:] = tokens_ending_at([length - 1])  # an earlier call's row: pooled within the same bucket
        torch.testing.assert_close(function(static)[:3], expected, rtol=1e-5, atol=1e-6)


def _native_pointers_expected(device: str) -> bool:
    """On a CUDA model the watch tests pointers in one extension call, where the extension is built with it."""
    from clip_flash.ops._extension import load_extension

    return device == "cuda" and hasattr(load_extension(), "TensorPointers")


WATCH_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", WATCH_DEVICES)
def test_watch_detects_what_invalidates_graphs_and_nothing_else(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = tiny_clip().to(device)
    image, text = _tower_watches(model)
    assert (image._native is not None) == (text._native is not None) == _native_pointers_expected(device)
    assert image.stale_reason() is None and text.stale_reason() is None and not image.training

    # In-place updates keep the storage: graphs read them correctly, nothing to invalidate.
    with torch.no_grad():
        model.visual.proj.mul_(2)
    model.load_state_dict(model.state_dict())
    model.to(torch.float32)  # a no-op conversion returns the same tensors
    assert image.stale_reason() is None and text.stale_reason() is None

    model.visual.proj = nn.Parameter(model.visual.proj.detach().clone())  # a new Parameter object
    assert "reassigned" in image.stale_reason() and text.stale_reason() is None

    image, text = _tower_watches(model)
    block = model.visual.transformer.resblocks[1]
    block.mlp.c_fc.weight.data = block.mlp.c_fc.weight.data.clone()  # a .data swap
    assert "moved, converted or replaced" in image.stale_reason() and text.stale_reason() is None

    image, text = _tower_watches(model)
    model.attn_mask = model.attn_mask.clone()  # a buffer reassigned
    assert "reassigned" in text.stale_reason() and image.stale_reason() is None

    image, text = _tower_watches(model)
    model.ln_final = nn.LayerNorm(64)  # a submodule replaced
    assert "reassigned" in text.stale_reason() and image.stale_reason() is None

    image, text = _tower_watches(model)
    model.positional_embedding = nn.Parameter(model.positional_embedding.detach() + 1)  # a text parameter on the root
    assert "reassigned" in text.stale_reason() and image.stale_reason() is None

    image, text = _tower_watches(model)
    model.visual = copy.deepcopy(model.visual)  # the whole tower replaced
    assert "reassigned" in image.stale_reason() and text.stale_reason() is None

    image, text = _tower_watches(model)
    model.half()
    assert "moved, converted" in image.stale_reason() and "moved, converted" in text.stale_reason()

    # Converted and converted back: the watched storage stays pinned, so the new one cannot land at its address.
    image, _ = _tower_watches(model)
    model.visual.float().half()
    assert "moved, converted" in image.stale_reason()

    image, text = _tower_watches(model)
    clip_flash.patch(model)
    assert "patch state" in image.stale_reason() and "patch state" in text.stale_reason()
    image, text = _tower_watches(model)
    clip_flash.unpatch(model)
    assert "patch state" in image.stale_reason() and "patch state" in text.stale_reason()

    image, _ = _tower_watches(model)
    model.visual.train()
    assert image.training
    model.eval()

    assert image in _live_watches
    image.close()
    assert image not in _live_watches


@pytest.mark.parametrize("device", WATCH_DEVICES)
def test_watch_detects_conversions_that_replace_parameter_objects(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = tiny_clip().to(device)
    image, _ = _tower_watches(model)
    assert (image._native is not None) == _native_pointers_expected(device)
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        assert image.stale_reason() is None
        model.visual.double()
        assert image.stale_reason() is not None
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)


def test_encoder_sets_up_again_after_a_change_and_refuses_training_mode():
    model = tiny_clip()
    clip_flash.patch(model)
    encoder = GraphedEncoder(model)
    images, tokens = images_for(model, 2), tokens_ending_at([5, 20])
    with torch.no_grad():
        encoder.encode_image(images)
        assert encoder.stats().invalidations == 0
        model.visual.proj = nn.Parameter(model.visual.proj.detach() * 2)
        assert torch.equal(encoder.encode_image(images), model.encode_image(images))
        assert encoder.stats().invalidations == 1
        clip_flash.unpatch(model)
        assert torch.equal(encoder.encode_text(tokens), model.encode_text(tokens))
        assert encoder.stats().invalidations == 2
        assert encoder.length_bucket(tokens) == 77  # the stock text tower no longer skips padding

        model.train()
        with pytest.raises(RuntimeError, match="training mode"):
            encoder.encode_image(images)
        with pytest.raises(RuntimeError, match="training mode"):
            encoder.encode_text(tokens)
        model.eval()
        assert torch.equal(encoder.encode_image(images), model.encode_image(images))
        assert encoder.stats().invalidations == 2  # training mode refuses; it does not invalidate

        encoder.release()
        assert torch.equal(encoder.encode_text(tokens), model.encode_text(tokens))


def test_staleness_check_reads_the_watched_tensors_and_walks_no_module(build_model, monkeypatch):
    """The per-call check reads the pointers of the tensors listed at setup (one C call each); it never walks the
    model's modules, parameters or buffers, which would cost far more on every call."""
    model = build_model("ViT-B-32")
    image, text = _tower_watches(model)

    def walked(*args, **kwargs):
        raise AssertionError("stale_reason walked the model")

    try:
        for name in ("modules", "named_modules", "children", "parameters", "named_parameters", "buffers",
                     "named_buffers"):
            monkeypatch.setattr(nn.Module, name, walked)
        for watch in (image, text):
            assert watch.stale_reason() is None
    finally:
        monkeypatch.undo()
        image.close()
        text.close()


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------

CAPTIONS = ["a cat", "a photo of a small red car parked by the sea at night", "dog",
            "tiger shark swimming in very deep blue water, seen from below, with a diver nearby",
            "x " * 60]  # the last one is cut at the context length: EOT at the last position


def _gpu_models(name: str = "ViT-B-32"):
    """(fp32 reference, fp16 model) on the GPU with identical weights; the fp16 one is unpatched."""
    torch.manual_seed(0)
    reference = open_clip.create_model(name, pretrained=None, device="cuda").eval()
    model = open_clip.create_model(name, pretrained=None, precision="fp16", device="cuda").eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


def _token_pool(count: int = 40) -> torch.Tensor:
    captions = open_clip.get_tokenizer("ViT-B-32")(CAPTIONS)
    rows = torch.cat([captions, edge_case_tokens()])
    return rows[torch.arange(count) % rows.shape[0]]


def _pad(x: torch.Tensor, bucket: int) -> torch.Tensor:
    return torch.cat([x, x[:1].expand(bucket - x.shape[0], *x.shape[1:])])


def _eager_like_graph_image(model, encoder, images):
    """The model's eager call on the same padded shape the graph ran, choosing kernels as a capture does: expected
    bit-identical in the real rows."""
    bucket = encoder.batch_bucket(images.shape[0])
    if bucket is None:
        return model.encode_image(images)
    with choosing_for_replay():
        return model.encode_image(_pad(images, bucket))[: images.shape[0]]


def _eager_like_graph_text(model, encoder, tokens):
    bucket = encoder.batch_bucket(tokens.shape[0])
    if bucket is None:
        return model.encode_text(tokens)
    padded = _pad(tokens, bucket)
    plan = model.__dict__.get("_clip_flash_text")
    with choosing_for_replay():
        if plan is None:
            return model.encode_text(padded)[: tokens.shape[0]]
        return encode_pooled_text(model, padded, plan, cut_length=encoder.length_bucket(tokens))[: tokens.shape[0]]


def _pool_bytes(encoder: GraphedEncoder, pools=None) -> int:
    pools = encoder._setup.space.pools() if pools is None else pools
    return sum(s["total_size"] for pool in pools for s in torch.cuda.memory_snapshot(mempool_id=pool))


@pytest.fixture(scope="module")
def gpu_models():
    return _gpu_models()


@pytest.mark.gpu
@pytest.mark.parametrize("patched", [True, False], ids=["patched", "stock"])
def test_graphs_equal_eager_on_the_bucket_shape_and_follow_the_fp16_rule(gpu_models, patched):
    reference, model = gpu_models
    pool = _token_pool()
    images = images_for(model, 17, seed=3).cuda()
    sizes = (1, 3, 5, 16, 17)
    batches = {n: (images[:n].half(), pool[n:2 * n]) for n in sizes}  # CPU tokens, as the tokenizer returns them
    with torch.inference_mode():
        references = {n: (reference.encode_image(images[:n]), reference.encode_text(pool[n:2 * n].cuda()))
                      for n in sizes}
        stock = {n: (model.encode_image(x), model.encode_text(t.cuda())) for n, (x, t) in batches.items()}
        with clip_flash.patched(model) if patched else contextlib.nullcontext():
            encoder = GraphedEncoder(model)
            for n, (x, tokens) in batches.items():
                graph_image, graph_text = encoder.encode_image(x), encoder.encode_text(tokens)
                assert torch.equal(graph_image, _eager_like_graph_image(model, encoder, x)), n
                assert torch.equal(graph_text, _eager_like_graph_text(model, encoder, tokens.cuda())), n
                assert torch.equal(encoder.encode_text(tokens.cuda()), graph_text)  # GPU tokens: the same graph
                normalized = encoder.encode_image(x, normalize=True)
                torch.testing.assert_close(normalized, F.normalize(graph_image, dim=-1), rtol=0, atol=1e-3)
                for out, stock_out, ref in zip((graph_image, graph_text), stock[n], references[n]):
                    assert_within_twice_stock(out, stock_out, ref, f"batch {n}")
            stats = encoder.stats()
            assert stats.graphs > 0 and stats.replays == 4 * len(sizes) and stats.eager_calls == 0
            assert not stats.failed_captures and stats.invalidations == 0
            encoder.release()


@pytest.mark.gpu
def test_threads_with_mixed_batches_on_both_towers_get_eager_results(gpu_models):
    _, model = gpu_models
    sizes = (1, 3, 5, 16, 17, 2, 33, 8)  # 33 is above the largest bucket: eager
    pool = _token_pool(80)  # pool[n:2n] must hold n rows for every n in sizes
    images = images_for(model, 33, seed=7).cuda().half()
    with torch.inference_mode(), clip_flash.patched(model):
        encoder = GraphedEncoder(model)
        encoder.capture_all()
        expected_image = {n: _eager_like_graph_image(model, encoder, images[:n]) for n in sizes}
        expected_text = {n: _eager_like_graph_text(model, encoder, pool[n:2 * n].cuda()) for n in sizes}
        gpu_pool = pool.cuda()
        torch.cuda.synchronize()
        mismatches, errors = [], []

        def worker(thread: int):
            try:
                stream = torch.cuda.Stream() if thread % 2 else None  # half the callers on their own stream
                caller_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
                with torch.inference_mode(), caller_stream:
                    for call in range(25):
                        n = sizes[(thread + call) % len(sizes)]
                        if (thread + call) % 2:
                            out = encoder.encode_image(images[:n])
                            if not torch.equal(out, expected_image[n]):
                                mismatches.append(("image", thread, call, n))
                        else:
                            tokens = pool[n:2 * n] if call % 3 else gpu_pool[n:2 * n]
                            out = encoder.encode_text(tokens)
                            if not torch.equal(out, expected_text[n]):
                                mismatches.append(("text", thread, call, n))
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(repr(error))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert not mismatches, mismatches[:10]
        stats = encoder.stats()
        eager = sum(sizes[(t + c) % len(sizes)] == 33 for t in range(8) for c in range(25))
        assert stats.eager_calls == eager and stats.replays == 8 * 25 - eager and stats.invalidations == 0
        encoder.release()


@pytest.mark.gpu
def test_outputs_are_copies_not_graph_buffers(gpu_models):
    _, model = gpu_models
    with torch.inference_mode(), clip_flash.patched(model):
        encoder = GraphedEncoder(model)
        first_images, second_images = images_for(model, 3, 1).cuda().half(), images_for(model, 3, 2).cuda().half()
        first = encoder.encode_image(first_images)
        kept = first.clone()
        second = encoder.encode_image(second_images)  # same bucket: same graph, same static buffers
        first_images.zero_()  # the caller reuses its input buffer
        torch.cuda.synchronize()
        assert torch.equal(first, kept) and not torch.equal(first, second)
        captured = next(iter(encoder._setup.graphs.values()))
        static = captured.static_output
        for out in (first, second):
            assert not (static.data_ptr() <= out.data_ptr() < static.data_ptr() + static.numel() * static.itemsize)
        encoder.release()


@pytest.mark.gpu
def test_changes_to_the_model_recapture_or_refuse(caplog):
    model = tiny_clip().cuda()
    clip_flash.patch(model)
    encoder = GraphedEncoder(model, batch_sizes=(1, 4))
    images, tokens = images_for(model, 3).cuda(), tokens_ending_at([4, 30, 9])

    def check(dtype):
        with torch.inference_mode():
            x = images.to(dtype)
            assert torch.equal(encoder.encode_image(x), _eager_like_graph_image(model, encoder, x))
            assert torch.equal(encoder.encode_text(tokens), _eager_like_graph_text(model, encoder, tokens.cuda()))

    check(torch.float32)
    assert encoder.stats().graphs == 2
    model.half()
    check(torch.float16)
    assert encoder.stats().invalidations == 1 and encoder.stats().graphs == 2
    model.visual.proj = nn.Parameter(model.visual.proj.detach() * 2)
    check(torch.float16)
    block = model.transformer.resblocks[0]
    block.mlp.c_fc.weight.data = block.mlp.c_fc.weight.data * 3
    check(torch.float16)
    assert encoder.stats().invalidations == 3
    model.train()
    with pytest.raises(RuntimeError, match="training mode"):
        encoder.encode_image(images.half())
    model.eval()
    clip_flash.unpatch(model)
    check(torch.float16)
    assert encoder.stats().invalidations == 4

    caplog.set_level(logging.INFO, logger=LOGGER)
    model.cpu()
    with torch.inference_mode():
        assert torch.equal(encoder.encode_image(images.half().cpu()), model.encode_image(images.half().cpu()))
    assert encoder.stats().graphs == 0 and encoder.stats().no_graphs
    assert any("model is on cpu" in r.getMessage() for r in caplog.records if r.name == LOGGER)


@pytest.mark.gpu
def test_a_failed_capture_runs_eager_and_leaves_the_pool_sound(caplog):
    model = tiny_clip().cuda().half()
    clip_flash.patch(model)
    stock_encode_image = model.encode_image

    def encode_image_with_a_host_sync(images, normalize=False):
        features = stock_encode_image(images, normalize)
        features.float().sum().item()  # a backend that syncs: legal eager, illegal in capture
        return features

    model.encode_image = encode_image_with_a_host_sync
    caplog.set_level(logging.INFO, logger=LOGGER)
    encoder = GraphedEncoder(model, batch_sizes=(1, 4))
    images, tokens = images_for(model, 3).cuda().half(), tokens_ending_at([4, 30, 9])
    try:
        with torch.inference_mode():
            for _ in range(2):
                assert torch.equal(encoder.encode_image(images), stock_encode_image(images))
            failures = [r for r in caplog.records if r.name == LOGGER and "capture" in r.getMessage()
                        and r.levelno == logging.WARNING]
            assert len(failures) == 1  # warned once, when the capture failed
            assert not torch.cuda.is_current_stream_capturing()
            # The shared pool still captures, replays and frees after the failure.
            assert torch.equal(encoder.encode_text(tokens), _eager_like_graph_text(model, encoder, tokens.cuda()))
        stats = encoder.stats()
        assert stats.graphs == 1 and len(stats.failed_captures) == 1 and stats.eager_calls == 2
        pools = encoder._setup.space.pools()
        assert _pool_bytes(encoder) > 0
        encoder.release()  # the failed capture gave its use of the pool back: every pool can be freed
        assert _pool_bytes(encoder, pools) == 0
    finally:
        del model.encode_image


@pytest.mark.gpu
def test_memory_is_bounded_and_returned(gpu_models):
    _, model = gpu_models
    pool = _token_pool(64)
    images = images_for(model, 32, seed=5).cuda().half()
    with torch.inference_mode(), clip_flash.patched(model):
        encoder = GraphedEncoder(model)
        stats = encoder.capture_all()
        assert stats.graphs == 6 + 6 * len(LENGTHS) and not stats.failed_captures
        assert 0 < stats.graph_memory_bytes < (512 << 20), stats.graph_memory_bytes
        assert _pool_bytes(encoder) <= stats.graph_memory_bytes
        assert stats.total_capture_seconds > 0
        print(f"GRAPHS ViT-B-32 fp16: {stats.graphs} graphs, {stats.total_capture_seconds:.2f} s to capture, "
              f"{stats.graph_memory_bytes / 2**20:.1f} MiB held")
        allocated = torch.cuda.memory_allocated()
        for call in range(200):
            n = (1, 3, 7, 16, 32)[call % 5]
            encoder.encode_image(images[:n]) if call % 2 else encoder.encode_text(pool[call % 30:call % 30 + n])
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() - allocated < (1 << 20)  # nothing kept per call
        assert encoder.stats().graphs == stats.graphs  # no graph added by serving
        pool, reserved = encoder._setup.space.pool, torch.cuda.memory_reserved()
        encoder.release()
        assert sum(s["total_size"] for s in torch.cuda.memory_snapshot(mempool_id=pool)) == 0
        assert reserved - torch.cuda.memory_reserved() >= stats.graph_memory_bytes // 2

        # Invalidation cycles do not pile pools up.
        encoder = GraphedEncoder(model, batch_sizes=(1, 8))
        after_cycles = []
        for cycle in range(3):
            proj = model.visual.proj
            model.visual.proj = nn.Parameter(proj.detach().clone())
            encoder.encode_image(images[:5])
            torch.cuda.synchronize()
            after_cycles.append(torch.cuda.memory_reserved())
        assert encoder.stats().invalidations >= 2
        assert after_cycles[-1] <= after_cycles[0] + (8 << 20), after_cycles
        encoder.release()


@pytest.mark.gpu
def test_autocast_runs_eager(gpu_models, caplog):
    reference, _ = gpu_models
    caplog.set_level(logging.INFO, logger=LOGGER)
    encoder = GraphedEncoder(reference)
    images = images_for(reference, 2).cuda()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        assert torch.equal(encoder.encode_image(images), reference.encode_image(images))
    assert encoder.stats().graphs == 0 and encoder.stats().eager_calls == 1
    assert any("autocast" in r.getMessage() for r in caplog.records if r.name == LOGGER)
    encoder.release()


def _fp16_rule(output, reference) -> float:
    """Max abs difference relative to the reference's max abs (fp16 results must stay within 2e-3)."""
    output, reference = output.float(), reference.float()
    return ((output - reference).abs().max() / reference.abs().max()).item()


@pytest.mark.gpu
def test_eight_threads_mixed_batches_follow_the_fp16_rule_and_keep_earlier_results():
    """8 threads x 20 calls, batch sizes 1, 3, 5, 16, 17, 40 (40: above the largest bucket, eager), both towers,
    against the patched model's eager results on the unpadded batch (shapes differ, so the fp16 rule, not
    torch.equal); every result is checked again after all threads are done."""
    _, model = _gpu_models()
    sizes = (1, 3, 5, 16, 17, 40)
    pool = _token_pool(80)
    images = images_for(model, 40, seed=11).cuda().half()
    with torch.inference_mode(), clip_flash.patched(model):
        encoder = GraphedEncoder(model)
        expected_image = {n: model.encode_image(images[:n]) for n in sizes}
        expected_text = {n: model.encode_text(pool[n:2 * n].cuda()) for n in sizes}
        torch.cuda.synchronize()
        results, errors = [], []

        def worker(thread: int):
            try:
                stream = torch.cuda.Stream() if thread % 2 else None
                with torch.inference_mode(), (torch.cuda.stream(stream) if stream else contextlib.nullcontext()):
                    for call in range(20):
                        n = sizes[(thread * 7 + call) % len(sizes)]
                        tower = "image" if (thread + call) % 2 else "text"
                        if tower == "image":
                            out = encoder.encode_image(images[:n])
                        else:
                            out = encoder.encode_text(pool[n:2 * n] if call % 3 else pool[n:2 * n].cuda())
                        torch.cuda.current_stream().synchronize()
                        results.append((tower, n, out, out.clone()))
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(repr(error))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        torch.cuda.synchronize()
        assert not errors, errors
        assert len(results) == 8 * 20
        for tower, n, out, snapshot in results:
            expected = (expected_image if tower == "image" else expected_text)[n]
            assert out.shape == expected.shape and out.dtype == expected.dtype
            assert _fp16_rule(out, expected) <= 2e-3, (tower, n, _fp16_rule(out, expected))
            assert torch.equal(out, snapshot), (tower, n)  # later calls never overwrote an earlier result
        stats = encoder.stats()
        # (pool_memory_bytes is a memory_reserved delta; capture's empty_cache() can make it negative)
        assert stats["graphs"] > 0 and stats["graph_memory_bytes"] > 0
        assert stats["total_capture_seconds"] > 0 and stats["invalidations"] == 0
        assert stats["eager_calls"] == sum(n == 40 for _, n, _, _ in results)
        encoder.release()


@pytest.mark.gpu
def test_recaptures_after_a_float_then_half_round_trip(caplog):
    _, model = _gpu_models()
    clip_flash.patch(model)
    encoder = GraphedEncoder(model, batch_sizes=(1, 4))
    images, tokens = images_for(model, 3, seed=2).cuda(), _token_pool(3)
    caplog.set_level(logging.INFO, logger=LOGGER)

    def check(dtype):
        with torch.inference_mode():
            x = images.to(dtype)
            assert _fp16_rule(encoder.encode_image(x), model.encode_image(x)) <= 2e-3
            assert _fp16_rule(encoder.encode_text(tokens), model.encode_text(tokens.cuda())) <= 2e-3

    check(torch.float16)
    graphs = encoder.stats()["graphs"]
    assert graphs == 2
    model.float()
    with pytest.raises(ValueError, match="float16"):  # fp16 images into the now-fp32 model: a clear error
        encoder.encode_image(images.half())
    check(torch.float32)
    assert encoder.stats()["invalidations"] == 1 and encoder.stats()["graphs"] == 2
    # Back the way OpenCLIP makes fp16 models (model.half() would also halve LayerNormFp32's weights, which
    # stock OpenCLIP then rejects).
    open_clip.model.convert_weights_to_lp(model, torch.float16)
    check(torch.float16)
    stats = encoder.stats()
    assert stats["invalidations"] == 2 and stats["graphs"] == 2 and stats["graph_memory_bytes"] > 0
    assert any("changed" in r.getMessage() for r in caplog.records if r.name == LOGGER)
    encoder.release()


@pytest.mark.gpu
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "page-locked"])
def test_host_inputs_may_be_overwritten_as_soon_as_the_call_returns(gpu_models, pinned):
    """Host inputs go up asynchronously (staged in page-locked memory): a caller that reuses its buffer right
    after the call, while the device is still busy with earlier work, must not change the result."""
    _, model = gpu_models
    pool = _token_pool(80)
    with torch.inference_mode(), clip_flash.patched(model):
        encoder = GraphedEncoder(model)
        encoder.capture_all()
        expected = {n: _eager_like_graph_text(model, encoder, pool[n:2 * n].cuda()) for n in (3, 16, 32)}
        busy = torch.randn(4096, 4096, device="cuda", dtype=torch.half)
        for _ in range(3):
            for n in (3, 16, 32):
                tokens = pool[n:2 * n].clone()
                tokens = tokens.pin_memory() if pinned else tokens
                for _ in range(20):  # keep the device busy, so the input's copy runs well after the call returns
                    busy = busy @ busy / 64
                out = encoder.encode_text(tokens)
                tokens.fill_(7)  # the caller reuses its buffer at once
                assert torch.equal(out, expected[n]), (n, pinned)
        encoder.release()
