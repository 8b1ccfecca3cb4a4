"""``ImagePreprocessor.decode(items, on_layout=...)``: the layout handed out before the native decoder writes it,
its device step queued behind a gate (``prepare_layout``) while the CPU decodes, gives the rows ``prepare`` gives,
bit for bit, whenever the decoded batch says it is the batch (``early_layout_is_batch``); for every file of the
photo corpus alone (as a server's lone request) and for the corpus as one batch."""
from __future__ import annotations

import threading

import pytest
import torch

import clip_flash
from clip_flash.ops.host_gate import HostGate
from photo_corpus import assert_same_as_reference


def _early_and_usual(prep, gate, items):
    """(decoded, early rows or None, usual prepared batch, whether the gate timed out). As the server does it:
    another thread queues the early work behind the gate, which the native decoder opens."""
    stream = torch.cuda.Stream()
    early = {}

    def launch(layout, ticket):
        with torch.cuda.stream(stream):
            gate.wait(ticket)
            early["rows"] = prep.prepare_layout(layout)

    def on_layout(layout):
        ticket = early["ticket"] = gate.next_ticket()
        early["thread"] = threading.Thread(target=launch, args=(layout, ticket))
        early["thread"].start()
        return gate.opener(ticket)

    try:
        decoded = prep.decode(items, on_layout=on_layout)
    finally:
        if "ticket" in early:
            gate.open(early["ticket"])
            early["thread"].join()
    usual = prep.prepare(decoded)
    torch.cuda.synchronize()
    return decoded, early.get("rows"), usual, "ticket" in early and gate.timed_out(early["ticket"])


@pytest.mark.parametrize("dtype", [torch.float16])
def test_early_rows_are_the_usual_rows_for_every_file_alone_and_for_the_batch(photo_files, vit_b32_preprocess, dtype):
    gate = HostGate.create(torch.device("cuda"))
    if gate is None:
        pytest.skip("the compiled extension clip_flash._C is not available")
    prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=dtype)
    if not prep.launches_early:
        pytest.skip("the native decoder or the resize kernel is not available")
    early_files = []
    for path in photo_files:
        decoded, early, usual, timed_out = _early_and_usual(prep, gate, [str(path)])
        assert not timed_out
        if decoded.early_layout_is_batch:
            early_files.append(str(path))
            assert early.indices == usual.indices and early.failures == [], path
            assert torch.equal(early.pixels, usual.pixels), path
        assert_same_as_reference(usual, vit_b32_preprocess, [str(path)], dtype)
    jpegs = [path for path in photo_files if path.suffix == ".jpg" and "cmyk" not in path.name]
    assert len(early_files) >= len(jpegs) // 2, (len(early_files), len(jpegs))
    decoded, early, usual, _ = _early_and_usual(prep, gate, [str(path) for path in photo_files])
    if decoded.early_layout_is_batch:  # not with the corpus's Pillow-only files (RGBA, CMYK, ...): usual rows
        assert torch.equal(early.pixels, usual.pixels)
    else:
        assert any(path.suffix in (".webp", ".bmp", ".tif") for path in photo_files)
    # The files that went early alone, as one batch (pixels and coefficients routes together).
    decoded, early, usual, _ = _early_and_usual(prep, gate, early_files)
    assert decoded.early_layout_is_batch
    assert early.indices == usual.indices and torch.equal(early.pixels, usual.pixels)
    assert_same_as_reference(usual, vit_b32_preprocess, early_files, dtype)
