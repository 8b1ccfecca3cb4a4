"""``backend="auto"`` from measured attention tables (clip_flash/backends/attention_table.py and measured.py,
clip_flash/backends/measure_attention.py).

CPU tests fake the GPU (``attention_table.current_gpu``) and the backends (spies registered in the backend registry)
to check parsing, choosing between measured shapes, which table applies, dispatch, fallbacks. GPU tests (skipped without
CUDA; the flash-attn ones also without flash-attn) check flash_attn against the accuracy rule of
tests/patching/test_gpu_accuracy.py at head dims 64, 80 and 88, its packed text path, and that ``auto`` runs what a
table for this GPU says.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import List

import open_clip
import pytest
import torch
import torch.nn.functional as F
from tests.utils import assert_within_twice_stock, edge_case_tokens, relative_error
from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg, convert_weights_to_lp

import clip_flash
import clip_flash.backends as backends_pkg
from clip_flash.backends import AttentionBackend, AttentionNeeds, choose_backend, get_backend, measured
from clip_flash.backends.flash_attn import FlashAttnBackend
from clip_flash.backends import attention_table, registry
from clip_flash.backends.attention_table import AttentionTableError, parse_table
from clip_flash.backends.measured import MeasuredAutoBackend
from clip_flash.backends import sdpa as sdpa_module
from clip_flash.backends.sdpa import SdpaBackend
from clip_flash.patching.report import PatchReport

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_GPU = ("Fake GPU 9000", (9, 0))
REFERENCE = get_backend("reference")


@pytest.fixture(autouse=True)
def clean_tables(monkeypatch):
    """No registered table, env table or cached decision leaks between tests."""
    monkeypatch.delenv(attention_table.TABLE_ENV, raising=False)
    attention_table.clear_attention_tables()
    yield
    attention_table.clear_attention_tables()


@pytest.fixture
def sdpa_cuda_kernels(monkeypatch):
    """SDPA's pinned CUDA kernels report themselves runnable, as on a GPU machine (they do not on a CPU one)."""
    monkeypatch.setattr(sdpa_module, "_cuda_kernel_unavailable", lambda pinned: None)


@pytest.fixture
def fake_gpu(monkeypatch, sdpa_cuda_kernels):
    """Pretend the current CUDA device is FAKE_GPU (the table lookup and the backends' availability see it)."""
    monkeypatch.setattr(attention_table, "current_gpu", lambda: FAKE_GPU)
    return FAKE_GPU


def entry(batch, seq, ms, *, dtype="float16", causal=False, varlen=False, heads=16, head_dim=64, **extra):
    timed = {name: value for name, value in ms.items() if value is not None}
    data = {"dtype": dtype, "causal": causal, "varlen": varlen, "batch": batch, "seq": seq, "heads": heads,
            "head_dim": head_dim, "ms": ms, "best": min(timed, key=timed.get) if timed else None}
    data.update(extra)
    return data


def table_dict(entries, gpu=FAKE_GPU[0], capability=FAKE_GPU[1]):
    return {"gpu": gpu, "capability": list(capability) if capability else None, "torch": torch.__version__,
            "cuda": torch.version.cuda, "flash_attn": None, "command": "test", "created": "now", "entries": entries}


def write_table(path: Path, entries, **kwargs) -> Path:
    path.write_text(json.dumps(table_dict(entries, **kwargs)))
    return path


def everything(name: str) -> bool:
    return True


class Spy(AttentionBackend):
    """A backend that records its calls and computes with the fp32 reference."""

    supports_varlen = True

    def __init__(self, name: str, accepts: bool = True):
        self.name = name
        self.calls: List[tuple] = []
        self._accepts = accepts

    def accepts(self, q):
        return self._accepts

    def attend(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        self.calls.append(("attend", tuple(q.shape), causal, attn_mask is not None))
        return REFERENCE.attend(q, k, v, causal, attn_mask, dropout_p)

    def attend_varlen(self, q, k, v, cu_seqlens, max_seqlen, causal):
        self.calls.append(("varlen", tuple(q.shape), causal, max_seqlen))
        return REFERENCE.attend_varlen(q, k, v, cu_seqlens, max_seqlen, causal)


@pytest.fixture
def spies(monkeypatch):
    """Spy backends "spy:a", "spy:b", "spy:picky" (accepts nothing) and a spy in place of "sdpa"."""
    made = {name: Spy(name) for name in ("spy:a", "spy:b", "sdpa")}
    made["spy:picky"] = Spy("spy:picky", accepts=False)
    for name, spy in made.items():
        monkeypatch.setitem(registry._BACKENDS, name, spy)
    return made


def qkv(batch, seq, heads=2, head_dim=8, dtype=torch.float32, seed=0):
    """q, k, v as views of one (B, L, 3, H, D) tensor, as a patched block passes them."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, 3, heads, head_dim, generator=g, dtype=dtype).unbind(2)


# ---------------------------------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------------------------------

def test_table_parses_and_round_trips(tmp_path):
    path = write_table(tmp_path / "t.json", [
        entry(256, 257, {"sdpa:cudnn": 0.46, "sdpa:flash": 0.64, "flash_attn": None},
              errors={"flash_attn": "skipped: not installed"}, device_ms={"sdpa:cudnn": 0.4, "sdpa:flash": 0.6}),
        entry(16, 40, {"sdpa": 0.05, "flash_attn": 0.04}, causal=True, varlen=True, heads=12, tokens=384),
    ])
    table = attention_table.read_table(path)
    assert table.gpu == FAKE_GPU[0] and table.capability == (9, 0) and table.source == str(path)
    assert table.meta["command"] == "test" and len(table.entries) == 2
    first, packed = table.entries
    assert (first.dtype, first.causal, first.varlen, first.batch, first.seq, first.heads, first.head_dim) == \
        ("float16", False, False, 256, 257, 16, 64)
    assert first.ms == {"sdpa:cudnn": 0.46, "sdpa:flash": 0.64, "flash_attn": None}
    assert first.best == "sdpa:cudnn" and first.errors == {"flash_attn": "skipped: not installed"}
    assert first.device_ms == {"sdpa:cudnn": 0.4, "sdpa:flash": 0.6} and packed.device_ms == {}
    assert packed.varlen and packed.causal and packed.tokens == 384 and packed.heads == 12
    again = parse_table(table.to_dict(), "again")
    assert again.to_dict() == table.to_dict()


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.pop("gpu"), "missing 'gpu'"),
    (lambda t: t.update(capability=[9]), "capability"),
    (lambda t: t.update(entries={}), "'entries' must be list"),
    (lambda t: t["entries"][0].pop("head_dim"), r"entries\[0\]: missing 'head_dim'"),
    (lambda t: t["entries"][0].update(dtype="float8"), r"entries\[0\].*unknown dtype"),
    (lambda t: t["entries"][0]["ms"].update(flash_attn=-1.0), r"ms\['flash_attn'\] must be a positive number"),
    (lambda t: t["entries"][0].update(device_ms={"sdpa:flash": "fast"}),
     r"device_ms\['sdpa:flash'\] must be a positive number"),
    (lambda t: t["entries"][0].update(device_ms=[0.1]), "'device_ms' must be dict"),
    (lambda t: t["entries"][0].update(batch="256"), "'batch' must be int"),
    (lambda t: t["entries"][0].update(causal=1), "'causal' must be bool"),
    (lambda t: t["entries"][0].update(varlen="no"), "'varlen' must be bool"),
    (lambda t: t["entries"][0].update(seq=0), ">= 1"),
])
def test_malformed_tables_are_refused_with_the_place(mutate, message):
    data = table_dict([entry(1, 50, {"sdpa:cudnn": 0.1})])
    mutate(data)
    with pytest.raises(AttentionTableError, match=message):
        parse_table(data, "bad.json")


def test_unreadable_table_file_is_an_error_when_loaded_explicitly(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(AttentionTableError, match="not valid JSON"):
        attention_table.load_attention_table(broken)
    with pytest.raises(AttentionTableError, match="cannot read"):
        attention_table.load_attention_table(tmp_path / "missing.json")
    assert not attention_table._registered  # nothing was registered


# ---------------------------------------------------------------------------------------------------------------
# the per-call choice: estimated between measured shapes (through MeasuredAutoBackend, the path patched models run)
# ---------------------------------------------------------------------------------------------------------------

def _grid_table():
    return parse_table(table_dict([
        entry(1, 257, {"spy:a": 0.1, "spy:b": 0.2}),
        entry(256, 257, {"spy:a": 0.9, "spy:b": 0.5}),
        entry(256, 50, {"spy:a": 0.3, "spy:b": 0.4}),
        entry(16, 257, {"spy:a": 0.2, "spy:b": 0.1}, heads=12),  # another head count
        entry(1, 77, {"spy:a": 0.1, "spy:b": 0.05}, causal=True),
        entry(16, 30, {"spy:a": 0.1, "spy:b": 0.2}, causal=True, varlen=True, tokens=300),
        entry(4, 257, {"spy:a": 0.3, "spy:b": 0.1}, dtype="bfloat16"),
    ]))


def _decide(table, *, dtype, causal, varlen, heads, head_dim, batch, seq, usable=everything, site="cpu") -> str:
    """The backend a measured site of this kind runs a call of this shape on (the fallback when none fits).

    ``site="cuda"`` digests the table for a CUDA site (CPU tensors stand in for the call's)."""
    backend = MeasuredAutoBackend(table, dtype, head_dim, causal, device_type=site, usable=usable)
    backend.device_type = "cpu"
    q = torch.empty(batch, seq, heads, head_dim, dtype=backend.dtype)
    return backend.decision(q, causal, varlen, batch, seq, seq).name


@pytest.mark.parametrize("query, expected", [
    (dict(batch=1, seq=257), "spy:a"),           # exact entry
    (dict(batch=2, seq=257), "spy:a"),           # an eighth of the way (log scale) from b1 to b256
    (dict(batch=128, seq=257), "spy:b"),         # seven eighths of the way
    (dict(batch=256, seq=60), "spy:a"),          # near s50 (one b256 entry) rather than s257
    (dict(batch=200, seq=257, heads=12), "spy:b"),  # same heads preferred even when farther
    (dict(batch=200, seq=257, heads=8), "spy:b"),   # no entry with 8 heads: the nearest head count's (12)
    (dict(batch=1, seq=77, causal=True), "spy:b"),
    (dict(batch=16, seq=30, causal=True, varlen=True), "spy:a"),
    (dict(batch=1, seq=257, dtype="bfloat16"), "spy:b"),
    (dict(batch=1, seq=257, head_dim=80), "sdpa"),  # no entry with this head dim: the fallback
    (dict(batch=1, seq=257, dtype=torch.float32), "sdpa"),
    (dict(batch=1, seq=257, causal=True, varlen=True, head_dim=80), "sdpa"),
])
def test_choice_estimates_between_measured_shapes(spies, query, expected):
    args = dict(dtype=torch.float16, causal=False, varlen=False, heads=16, head_dim=64)
    args.update(query)
    assert _decide(_grid_table(), **args) == expected


def test_choice_skips_backends_unavailable_here(monkeypatch, sdpa_cuda_kernels):
    """The fastest timing loses to the fastest *available* one; an entry with nothing available is passed over."""
    from clip_flash.backends.base import BackendStatus
    monkeypatch.setattr(FlashAttnBackend, "status", lambda self: BackendStatus(self.name, False, "not here"))
    table = parse_table(table_dict([
        entry(16, 257, {"flash_attn": 0.1, "sdpa:flash": 0.3, "sdpa:cudnn": 0.2, "reference": 0.01,
                        "no-such-backend": 0.001}),
        entry(64, 257, {"flash_attn": 0.1}),  # nearest to b64, but nothing in it can run here
        entry(256, 257, {"flash_attn": 0.5, "sdpa:flash": 0.3, "sdpa:cudnn": 0.6}),
    ]))
    # The pinned kernels serve CUDA sites only: ask as one would, with CPU tensors let through to the pick.
    monkeypatch.setattr(measured, "runnable_on", lambda backend, q: backend)
    decide = lambda batch: _decide(table, dtype=torch.float16, causal=False, varlen=False, heads=16,  # noqa: E731
                                   head_dim=64, batch=batch, seq=257, usable=measured.backend_usable, site="cuda")
    assert decide(16) == "sdpa:cudnn"   # not flash_attn (unavailable), not reference (never automatic)
    # The b64 entry is passed over: between b16 and b256, cuDNN is estimated faster at b32, flash at b64.
    assert decide(32) == "sdpa:cudnn" and decide(64) == "sdpa:flash"
    # Names the registry does not know are never chosen, whatever ``usable`` says.
    assert _decide(table, dtype=torch.float16, causal=False, varlen=False, heads=16, head_dim=64, batch=16,
                   seq=257, site="cuda") == "reference"
    assert not measured.backend_usable("flash_attn") and not measured.backend_usable("reference")
    assert measured.backend_usable("sdpa:cudnn") and not measured.backend_usable("no-such-backend")


def test_measured_backend_uses_the_table_for_the_current_gpu(tmp_path, fake_gpu, monkeypatch):
    attention_table.load_attention_table(write_table(tmp_path / "t.json", [entry(4, 50, {"sdpa:efficient": 0.1,
                                                                                  "sdpa:cudnn": 0.2})]))
    needs = AttentionNeeds(device_type="cuda", dtype=torch.float16, head_dim=64)
    backend = measured.measured_backend(needs)
    q = torch.empty(4, 50, 16, 64, dtype=torch.float16)
    backend.device_type = "cpu"  # CPU tensors stand in for the fake GPU's
    monkeypatch.setattr(measured, "runnable_on", lambda backend, q: backend)
    assert backend.decision(q, False, False, 4, 50, 50).name == "sdpa:efficient"
    monkeypatch.setattr(attention_table, "current_gpu", lambda: None)  # no CUDA: no table applies
    assert measured.measured_backend(needs) is None


# ---------------------------------------------------------------------------------------------------------------
# which table applies
# ---------------------------------------------------------------------------------------------------------------

def test_table_applies_only_to_its_gpu_and_capability(tmp_path, fake_gpu, monkeypatch):
    other = attention_table.load_attention_table(
        write_table(tmp_path / "other.json", [entry(1, 50, {"sdpa:cudnn": 1.0})],
                                                      gpu="NVIDIA Other GPU"))
    assert attention_table.active_table() is None and not other.applies_to(*FAKE_GPU)
    wrong_cc = attention_table.load_attention_table(
        write_table(tmp_path / "cc.json", [entry(1, 50, {"sdpa:cudnn": 1.0})],
                                                         capability=(8, 0)))
    assert attention_table.active_table() is None and not wrong_cc.applies_to(*FAKE_GPU)
    mine = attention_table.load_attention_table(
        write_table(tmp_path / "mine.json", [entry(1, 50, {"sdpa:cudnn": 1.0})]))
    assert attention_table.active_table() is mine
    monkeypatch.setattr(attention_table, "current_gpu", lambda: ("NVIDIA Other GPU", (9, 0)))
    assert attention_table.active_table() is other


def test_env_table_and_precedence(tmp_path, fake_gpu, monkeypatch):
    env = write_table(tmp_path / "env.json", [entry(1, 50, {"sdpa:cudnn": 1.0})])
    monkeypatch.setenv(attention_table.TABLE_ENV, str(env))
    assert attention_table.active_table().source == str(env)
    registered = attention_table.load_attention_table(
        write_table(tmp_path / "reg.json", [entry(1, 50, {"sdpa:flash": 1.0})]))
    assert attention_table.active_table() is registered  # registered tables come before the env var's
    assert [t.source for t in attention_table.candidate_tables()][:2] == [registered.source, str(env)]


def test_broken_env_table_is_ignored_with_a_warning(tmp_path, fake_gpu, monkeypatch, caplog):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpu": FAKE_GPU[0]}))
    monkeypatch.setenv(attention_table.TABLE_ENV, str(bad))
    caplog.set_level(logging.WARNING, logger="clip_flash.backends.attention_table")
    assert attention_table.active_table() is None
    assert any("missing 'entries'" in record.getMessage() for record in caplog.records)


def test_logs_once_which_table_or_how_to_make_one(tmp_path, fake_gpu, caplog):
    caplog.set_level(logging.INFO, logger="clip_flash.backends.attention_table")
    attention_table.active_table(), attention_table.active_table()
    none_lines = [r.getMessage() for r in caplog.records if "no measured attention table" in r.getMessage()]
    assert len(none_lines) == 1 and "measure-attention" in none_lines[0] and FAKE_GPU[0] in none_lines[0]
    table = attention_table.load_attention_table(
        write_table(tmp_path / "t.json", [entry(1, 50, {"sdpa:cudnn": 1.0})]))
    caplog.clear()
    attention_table.active_table(), attention_table.active_table()
    used = [r.getMessage() for r in caplog.records if "uses the measured attention table" in r.getMessage()]
    assert len(used) == 1 and table.source in used[0]


# ---------------------------------------------------------------------------------------------------------------
# choose_backend("auto")
# ---------------------------------------------------------------------------------------------------------------

def _needs(dtype=torch.float16, head_dim=64, causal=False, explicit_mask=False, device="cuda", capability=(9, 0)):
    return AttentionNeeds(device, dtype, head_dim, causal, explicit_mask, False, capability)


def test_choose_auto_returns_the_measured_backend_when_a_table_covers_the_site(tmp_path, fake_gpu):
    attention_table.load_attention_table(write_table(tmp_path / "t.json", [
        entry(1, 257, {"sdpa:cudnn": 0.1, "sdpa:flash": 0.2}),
        entry(256, 257, {"sdpa:cudnn": 0.5, "sdpa:flash": 0.4}),
        entry(16, 257, {"sdpa:cudnn": 0.1, "sdpa:flash": 0.2}),
    ]))
    backend, rejected = choose_backend("auto", _needs())
    assert isinstance(backend, MeasuredAutoBackend) and rejected == {}
    assert backend.name == "auto(measured: sdpa:cudnn|sdpa:flash)"  # most wins first
    assert backend.supports_varlen and backend.winners == ["sdpa:cudnn", "sdpa:flash"]
    again, _ = choose_backend("auto", _needs())
    assert again is backend  # sites of one kind share the backend and its decisions

    # Not covered: the old fixed order (sdpa first).
    for needs in (_needs(head_dim=80), _needs(dtype=torch.bfloat16), _needs(causal=True),
                  _needs(explicit_mask=True), _needs(device="cpu", dtype=torch.float32, capability=None),
                  _needs(capability=(8, 0))):
        backend, _ = choose_backend("auto", needs)
        assert type(backend) is SdpaBackend and backend.name == "sdpa", needs
    # Forcing a backend by name never consults a table.
    assert choose_backend("sdpa:flash", _needs())[0] is get_backend("sdpa:flash")


def test_choose_auto_keeps_the_old_order_without_a_table_for_this_gpu(tmp_path, fake_gpu):
    attention_table.load_attention_table(write_table(tmp_path / "t.json", [entry(1, 257, {"sdpa:cudnn": 0.1})],
                                              gpu="Another GPU"))
    backend, rejected = choose_backend("auto", _needs())
    assert backend is get_backend(backends_pkg.AUTO_ORDER[0]) and rejected == {}


def test_table_whose_winners_cannot_run_here_is_not_used(tmp_path, fake_gpu, monkeypatch):
    from clip_flash.backends.base import BackendStatus
    monkeypatch.setattr(FlashAttnBackend, "status", lambda self: BackendStatus(self.name, False, "not here"))
    attention_table.load_attention_table(write_table(tmp_path / "t.json", [entry(1, 257, {"flash_attn": 0.1})]))
    assert choose_backend("auto", _needs())[0] is get_backend("sdpa")


def test_measured_backend_states_sdpa_limits(sdpa_cuda_kernels):
    table = parse_table(table_dict([entry(1, 17, {"sdpa:cudnn": 0.1}, causal=True)]))
    backend = MeasuredAutoBackend(table, torch.float16, 64, True, usable=everything)
    assert backend.winners == ["sdpa:cudnn"]
    sdpa = get_backend("sdpa")
    for needs in (AttentionNeeds("cuda", torch.float16, 64, True, False, True, (9, 0)),
                  AttentionNeeds("cpu", torch.float32, 64, True, False, True, None),
                  AttentionNeeds("cuda", torch.float16, 64, False, True, False, (7, 5))):
        assert backend.unsupported_reasons(needs) == sdpa.unsupported_reasons(needs)
    assert backend.unsupported_reasons(AttentionNeeds("cpu", torch.float32, 64, True, False, True, None))


# ---------------------------------------------------------------------------------------------------------------
# MeasuredAutoBackend: dispatch per call
# ---------------------------------------------------------------------------------------------------------------

def _cpu_backend(entries, dtype="float32", head_dim=8, causal=False):
    table = parse_table(table_dict(entries))
    return MeasuredAutoBackend(table, dtype, head_dim, causal, device_type="cpu")


def test_dispatches_per_shape_to_the_backend_the_table_picks(spies):
    backend = _cpu_backend([entry(2, 10, {"spy:a": 0.1, "spy:b": 0.2}, dtype="float32", heads=2, head_dim=8),
                            entry(64, 10, {"spy:a": 0.4, "spy:b": 0.2}, dtype="float32", heads=2, head_dim=8)])
    assert backend.name == "auto(measured: spy:a|spy:b)"
    q, k, v = qkv(2, 10)
    out = backend.attend(q, k, v, False)
    assert [c[0] for c in spies["spy:a"].calls] == ["attend"] and not spies["spy:b"].calls
    assert relative_error(out, REFERENCE.attend(q, k, v, False)) < 1e-6
    q, k, v = qkv(48, 10)
    backend.attend(q, k, v, False)
    assert spies["spy:b"].calls == [("attend", (48, 10, 2, 8), False, False)]
    assert not spies["sdpa"].calls


def test_falls_back_to_sdpa_for_masks_cross_attention_dtype_and_misses(spies):
    backend = _cpu_backend([entry(2, 10, {"spy:a": 0.1}, dtype="float32", heads=2, head_dim=8)])
    q, k, v = qkv(2, 10)
    mask = torch.zeros(10, 10).masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    out = backend.attend(q, k, v, False, attn_mask=mask)
    assert spies["sdpa"].calls == [("attend", (2, 10, 2, 8), False, True)]
    assert relative_error(out, REFERENCE.attend(q, k, v, False, mask)) < 1e-6
    backend.attend(q, k, v, False, dropout_p=0.1)  # tables time inference: dropout runs on sdpa
    q_short = q[:, :3]
    backend.attend(q_short, k, v, False)  # cross-attention shape (3 queries, 10 keys)
    q64, k64, v64 = qkv(2, 10, dtype=torch.float64)
    backend.attend(q64, k64, v64, False)  # a dtype the site was not measured for
    backend.attend(q, k, v, True)  # causal call: the table has no causal entries
    assert len(spies["sdpa"].calls) == 5 and not spies["spy:a"].calls
    backend.attend(q, k, v, False)
    assert len(spies["spy:a"].calls) == 1 and len(spies["sdpa"].calls) == 5


def test_falls_back_when_the_picked_backend_refuses_the_tensor(spies):
    backend = _cpu_backend([entry(2, 10, {"spy:picky": 0.1, "spy:a": 0.5}, dtype="float32", heads=2, head_dim=8)])
    q, k, v = qkv(2, 10)
    backend.attend(q, k, v, False)
    assert not spies["spy:picky"].calls and len(spies["sdpa"].calls) == 1 and not spies["spy:a"].calls


def test_tensors_on_another_device_type_fall_back(spies):
    table = parse_table(table_dict([entry(2, 10, {"spy:a": 0.1}, dtype="float32", heads=2, head_dim=8)]))
    backend = MeasuredAutoBackend(table, "float32", 8, False)  # measured for CUDA; these tensors are on the CPU
    backend.attend(*qkv(2, 10), False)
    assert not spies["spy:a"].calls and len(spies["sdpa"].calls) == 1


def test_varlen_calls_use_the_packed_entries(spies):
    backend = _cpu_backend([
        entry(2, 10, {"spy:a": 0.1, "spy:b": 0.2}, dtype="float32", heads=2, head_dim=8, causal=True),
        entry(3, 9, {"spy:a": 0.3, "spy:b": 0.2}, dtype="float32", heads=2, head_dim=8, causal=True, varlen=True,
              tokens=20),
    ], causal=True)
    lengths = torch.tensor([4, 9, 7])
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(int(lengths.sum()), 3, 2, 8, generator=g).unbind(1)
    out = backend.attend_varlen(q, k, v, cu_seqlens, 9, True)
    assert spies["spy:b"].calls == [("varlen", (20, 2, 8), True, 9)] and not spies["spy:a"].calls
    assert relative_error(out, REFERENCE.attend_varlen(q, k, v, cu_seqlens, 9, True)) < 1e-6
    backend.attend(*qkv(2, 10), True)  # a padded causal call uses the padded entry
    assert [c[0] for c in spies["spy:a"].calls] == ["attend"]


def test_a_seen_shape_costs_one_dict_lookup(spies, monkeypatch):
    backend = _cpu_backend([entry(2, 10, {"spy:a": 0.1}, dtype="float32", heads=2, head_dim=8)])
    decided = []
    original = MeasuredAutoBackend._decide
    monkeypatch.setattr(MeasuredAutoBackend, "_decide", lambda self, *a: decided.append(a[1:]) or original(self, *a))
    q, k, v = qkv(2, 10)
    for _ in range(3):
        backend.attend(q, k, v, False)
    backend.attend(*qkv(3, 10), False)
    assert len(decided) == 2 and len(spies["spy:a"].calls) == 4


def test_a_call_being_captured_into_a_graph_is_chosen_by_device_time(spies, monkeypatch):
    """Eager, the entry's eager times decide (the launch is most of a small call); captured into a CUDA graph, its
    device times (a replay pays only the kernel). An entry without device times decides by its eager ones."""
    backend = _cpu_backend([
        entry(2, 10, {"spy:a": 0.1, "spy:b": 0.2}, dtype="float32", heads=2, head_dim=8,
              device_ms={"spy:a": 0.02, "spy:b": 0.01}),
        entry(64, 10, {"spy:a": 0.1, "spy:b": 0.2}, dtype="float32", heads=2, head_dim=8),
    ])
    assert backend.name == "auto(measured: spy:a|spy:b)"
    capturing = []
    monkeypatch.setattr(measured, "being_captured", lambda q: bool(capturing))
    small, large = qkv(2, 10), qkv(64, 10)
    backend.attend(*small, False)
    backend.attend(*large, False)
    capturing.append(True)
    backend.attend(*small, False)
    backend.attend(*large, False)
    assert [call[1][0] for call in spies["spy:a"].calls] == [2, 64, 64]
    assert [call[1][0] for call in spies["spy:b"].calls] == [2]
    capturing.clear()  # eager again: the eager decision, remembered apart from the captured one
    backend.attend(*small, False)
    assert [call[1][0] for call in spies["spy:a"].calls] == [2, 64, 64, 2]


def test_a_stream_capturing_outside_clip_flash_chooses_as_eager(monkeypatch):
    """Someone's own capture, after eager warm-up calls, must record the kernels those calls ran."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not measured.being_captured(SimpleNamespace(is_cuda=True))


def test_a_cpu_call_is_never_taken_for_a_capture():
    q = torch.empty(1, 4, 2, 8)
    assert not measured.being_captured(q)
    with measured.choosing_for_replay():
        assert not measured.being_captured(q)


def test_a_graphs_warm_up_chooses_as_its_capture_on_its_own_thread_only():
    """Inside choosing_for_replay a CUDA call chooses as a capture does (so the warm-up runs the kernels the capture
    records); the flag is per thread and restored on exit, nested or not."""
    cuda_call = SimpleNamespace(is_cuda=True)
    seen = []
    with measured.choosing_for_replay():
        seen.append(measured.being_captured(cuda_call))
        with measured.choosing_for_replay():
            seen.append(measured.being_captured(cuda_call))
        seen.append(measured.being_captured(cuda_call))
        other = threading.Thread(target=lambda: seen.append(getattr(measured._for_replay, "on", False)))
        other.start()
        other.join()
    assert seen == [True, True, True, False] and not measured._for_replay.on


def test_dispatch_traces_under_torch_compile_without_graph_breaks():
    """The decision is plain Python on shapes: fullgraph tracing works, and picks what eager picks."""
    torch._dynamo.reset()
    backend = _cpu_backend([entry(2, 10, {"sdpa:math": 0.1, "reference": 0.01}, dtype="float32", heads=2,
                                  head_dim=8)])

    def attend(x):
        q, k, v = x.unbind(2)
        return backend.attend(q, k, v, False)

    x = torch.randn(2, 10, 3, 2, 8)
    expected = REFERENCE.attend(*x.unbind(2), False)
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    try:
        out = compiled(x)
        out_other = compiled(torch.randn(5, 10, 3, 2, 8))
    finally:
        torch._dynamo.reset()
    assert relative_error(out, expected) < 1e-5 and out_other.shape == (5, 10, 2, 8)
    assert set(backend._decisions.values()) == {get_backend("sdpa:math")}
    assert all(isinstance(size, int) for key in backend._decisions for size in key[4:])


# ---------------------------------------------------------------------------------------------------------------
# patch(), report, info
# ---------------------------------------------------------------------------------------------------------------

def tiny_clip(head_dim: int = 32, heads: int = 2, cast_dtype=None) -> CLIP:
    """A small OpenCLIP CLIP with the given head dim in both towers (no download)."""
    torch.manual_seed(0)
    width = head_dim * heads
    return CLIP(
        embed_dim=64,
        vision_cfg=CLIPVisionCfg(width=width, layers=2, head_width=head_dim, patch_size=16, image_size=64),
        text_cfg=CLIPTextCfg(width=width, heads=heads, layers=2, context_length=77, vocab_size=49408),
        cast_dtype=cast_dtype,
    ).eval()


def test_patch_on_cpu_ignores_gpu_tables_and_matches_stock(tmp_path, fake_gpu):
    model = tiny_clip()
    site = dict(dtype="float32", heads=2, head_dim=32)
    attention_table.load_attention_table(write_table(tmp_path / "t.json", [
        entry(2, 17, {"sdpa:efficient": 0.1}, **site),
        entry(7, 77, {"sdpa:efficient": 0.1}, causal=True, **site),
    ]))
    # The table covers these sites on the (faked) GPU ...
    assert isinstance(choose_backend("auto", _needs(torch.float32, 32))[0], MeasuredAutoBackend)
    tokens = edge_case_tokens()
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stock_text, stock_image = model.encode_text(tokens), model.encode_image(images)
        with clip_flash.patched(model) as report:
            text, image = model.encode_text(tokens), model.encode_image(images)
    # ... but tables are per GPU: a CPU model gets the fixed order, and the report says nothing of tables.
    assert {site.backend for site in report.sites} == {"sdpa"}
    assert report.attention_table is None and "auto attention" not in str(report)
    assert relative_error(text, stock_text) < 1e-4 and relative_error(image, stock_image) < 1e-4


def test_report_says_which_table_auto_used(tmp_path, fake_gpu):
    without = PatchReport("CLIP", "auto", "float16", "cuda:0")
    assert without.attention_table.startswith(f"sdpa (no measured table for {FAKE_GPU[0]}")
    assert f"auto attention: sdpa (no measured table for {FAKE_GPU[0]}" in str(without)
    table = attention_table.load_attention_table(
        write_table(tmp_path / "t.json", [entry(1, 50, {"sdpa:cudnn": 1.0})]))
    with_table = PatchReport("CLIP", "auto", "float16", "cuda:0")
    assert with_table.attention_table == f"measured table {table.source} ({FAKE_GPU[0]}, 1 entries)"
    assert with_table.to_dict()["attention_table"] == with_table.attention_table
    assert PatchReport("CLIP", "sdpa", "float16", "cuda:0").attention_table is None  # forced: no table involved
    assert PatchReport("CLIP", "auto", "float32", "cpu").attention_table is None


def test_info_lists_the_table_in_use(tmp_path, fake_gpu, capsys):
    import clip_flash.info as info
    assert info._attention_table()["path"] is None and FAKE_GPU[0] in info._attention_table()["note"]
    table = attention_table.load_attention_table(
        write_table(tmp_path / "t.json", [entry(1, 50, {"sdpa:cudnn": 1.0}),
                                                                           entry(4, 50, {"sdpa:cudnn": 1.0})]))
    assert info._attention_table() == {"path": table.source, "gpu": FAKE_GPU[0], "entries": 2, "note": None}
    info.main([])
    assert f"attention table: {table.source} ({FAKE_GPU[0]}, 2 entries)" in capsys.readouterr().out


def test_shipped_tables_parse():
    """Every table shipped in clip_flash/backends/attention_tables/ is valid (and so usable on its GPU)."""
    for path in attention_table.shipped_table_paths():
        table = attention_table.read_table(path)
        assert table.entries and table.gpu, path


def test_setup_ships_the_table_folder():
    project_text = (REPO_ROOT / "pyproject.toml").read_text()  # package data is declared there
    assert '"backends/attention_tables/*.json"' in project_text
    assert "recursive-include clip_flash/backends/attention_tables *.json" in (REPO_ROOT / "MANIFEST.in").read_text()
    assert attention_table.SHIPPED_TABLE_DIR == REPO_ROOT / "clip_flash" / "backends" / "attention_tables"


# ---------------------------------------------------------------------------------------------------------------
# clip_flash/backends/measure_attention.py (the parts that run without a GPU)
# ---------------------------------------------------------------------------------------------------------------

from clip_flash.backends import measure_attention  # noqa: E402


@pytest.mark.parametrize("name, vision, text", [
    ("ViT-B-32", (50, 12, 64, False), (77, 8, 64, True)),
    ("ViT-L-14", (257, 16, 64, False), (77, 12, 64, True)),
    ("ViT-H-14", (257, 16, 80, False), (77, 16, 64, True)),
    ("ViT-g-14", (257, 16, 88, False), (77, 16, 64, True)),
    ("RN50", None, (77, 8, 64, True)),                     # ResNet vision: no transformer attention
    ("ViT-B-16-SigLIP", None, (64, 12, 64, False)),       # bidirectional text
])
def test_script_derives_attention_shapes_from_configs(name, vision, text):
    assert measure_attention.tower_geometry(name) == {"vision": vision, "text": text}


def test_script_plans_distinct_shapes_with_their_models():
    shapes, notes = measure_attention.plan_shapes(["ViT-H-14", "ViT-g-14"], ["float16"], [4], [16], [None], (8, 40), 0)
    text = [s for s in shapes if s.causal and not s.varlen]
    packed = [s for s in shapes if s.varlen]
    assert len(text) == 1 and shapes[text[0]] == ["ViT-H-14", "ViT-g-14"]  # same text tower: timed once
    assert len(packed) == 1 and len(packed[0].lengths) == 16 and all(8 <= n <= 40 for n in packed[0].lengths)
    assert packed[0].seq == max(packed[0].lengths) and packed[0].tokens == sum(packed[0].lengths)
    assert {(s.seq, s.head_dim) for s in shapes if not s.causal} == {(257, 80), (257, 88)}
    assert measure_attention.varlen_lengths(16, 8, 40, 0) == packed[0].lengths  # fixed seed: same lengths
    assert not notes


def test_script_times_padded_captions_at_short_lengths_and_the_context_by_default():
    shapes, _ = measure_attention.plan_shapes(["ViT-B-32", "ViT-B-16-SigLIP"], ["float16"], [], [4],
                                              measure_attention.DEFAULT_TEXT_SEQS, (8, 40), 0)
    padded = {(s.causal, s.seq) for s in shapes if not s.varlen}
    assert padded == {(True, 8), (True, 16), (True, 32), (True, 77), (False, 8), (False, 16), (False, 32), (False, 64)}
    longer, _ = measure_attention.plan_shapes(["ViT-B-16-SigLIP"], ["float16"], [], [4], [100], (8, 40), 0)
    assert [s.seq for s in longer] == [64]  # no length past the context


def test_script_entries_parse_as_a_table_and_render():
    shape = measure_attention.Shape("float16", True, True, 3, 9, 8, 64, (4, 9, 7))
    result = measure_attention.Measurement(shape, ["ViT-B-32"], {"sdpa": 0.2, "flash_attn": 0.1},
                                           {})
    padded = measure_attention.Measurement(measure_attention.Shape("float16", False, False, 4, 50, 12, 64),
                                           ["ViT-B-32"], {"sdpa:cudnn": 0.3, "sdpa:flash": 0.35, "flash_attn": None},
                                           {"flash_attn": "skipped: not installed"},
                                           {"sdpa:cudnn": 0.02, "sdpa:flash": 0.01, "flash_attn": None})
    data = table_dict([result.to_entry(), padded.to_entry()], gpu="NVIDIA H100 80GB HBM3")
    data.update(cudnn=91900, repeats=50, warmup=10)
    table = parse_table(data)
    assert table.entries[0].tokens == 20 and table.entries[0].best == "flash_attn"
    assert table.entries[1].best == "sdpa:cudnn" and table.entries[1].ms["flash_attn"] is None
    assert table.entries[1].fastest(everything, replay=True) == "sdpa:flash"
    assert table.entries[0].fastest(everything, replay=True) == "flash_attn"  # no device times: the eager ones
    text = measure_attention.render_markdown(data)
    assert "NVIDIA H100 80GB HBM3" in text and "cuDNN 91900" in text and "command: `test`" in text
    assert ("| float16 | varlen causal | ViT-B-32 | 3 | 9 | 20 | 8 | 64 | 0.2000 | 0.1000 | - | - | **flash_attn** | "
            "- | - | - | - | - |") in text
    assert ("| float16 | full | ViT-B-32 | 4 | 50 | 200 | 12 | 64 | - | - | 0.3000 | 0.3500 | **sdpa:cudnn** | - | - | "
            "0.0200 | 0.0100 | **sdpa:flash** |") in text
    assert "flash_attn: skipped: not installed" in text
    near_tie = measure_attention.Measurement(measure_attention.Shape("float16", True, False, 16, 77, 12, 64),
                                             ["ViT-L-14"], {"sdpa:cudnn": 0.0926, "sdpa:flash": 0.0766},
                                             {}, {"sdpa:cudnn": 0.0108, "sdpa:flash": 0.0104})
    text = measure_attention.render_markdown(table_dict([near_tie.to_entry()]))
    # what auto runs: flash eagerly (17% faster), cuDNN replayed (flash within the margin of torch's first kernel)
    assert "| 0.0926 | 0.0766 | **sdpa:flash** | 0.0108 | 0.0104 | **sdpa:cudnn** |" in text
    assert near_tie.best_replayed == "sdpa:flash"  # the table keeps the raw fastest
    assert measure_attention.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_script_needs_cuda(capsys):
    assert measure_attention.main(["--models", "ViT-B-32"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# GPU: flash_attn at head dims 64/80/88, its packed text path, and auto following a table for this GPU
# ---------------------------------------------------------------------------------------------------------------

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CAPTIONS = [f"a photo of a {c}." for c in ("cat", "small red car parked by the sea", "dog", "tench", "goldfish",
                                          "great white shark", "tiger shark swimming in very deep blue water")]


def _flash_attn_or_skip():
    status = clip_flash.available_backends()["flash_attn"]
    if not status.available:
        pytest.skip(f"flash_attn: {status.reason}")


def _assert_within_rule(tower, out, stock, ref):
    """Patched error against fp32 at most about twice stock's (the rule of tests/patching/test_gpu_accuracy.py)."""
    assert_within_twice_stock(out, stock, ref, tower, log=True)


def _gpu_models(head_dim: int, precision: str):
    """(fp32 reference, stock model in ``precision`` as open_clip builds it) with identical weights, on CUDA."""
    reference = tiny_clip(head_dim).cuda()
    low = tiny_clip(head_dim, cast_dtype=DTYPES[precision])
    low.load_state_dict(reference.state_dict())
    low.cuda()
    convert_weights_to_lp(low, DTYPES[precision])
    return reference, low.eval()


def _gpu_inputs():
    tokens = torch.cat([open_clip.get_tokenizer("ViT-B-32")(CAPTIONS * 5), edge_case_tokens()]).cuda()
    images = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(0)).cuda()
    return tokens, images


@pytest.mark.gpu
@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 80, 88])
def test_flash_attn_forced_within_twice_stock_error(head_dim, precision):
    _flash_attn_or_skip()
    reference, model = _gpu_models(head_dim, precision)
    tokens, images = _gpu_inputs()
    dtype = DTYPES[precision]
    with torch.inference_mode():
        ref_text, ref_image = reference.encode_text(tokens), reference.encode_image(images)
        stock_text, stock_image = model.encode_text(tokens), model.encode_image(images.to(dtype))
        with clip_flash.patched(model, "flash_attn") as report:
            text, image = model.encode_text(tokens), model.encode_image(images.to(dtype))
    assert report.backends_used() == {"vision": ["flash_attn"], "text": ["flash_attn"]}, str(report)
    assert text.dtype == dtype and image.dtype == dtype
    _assert_within_rule(f"text d{head_dim} {precision}", text, stock_text, ref_text)
    _assert_within_rule(f"image d{head_dim} {precision}", image, stock_image, ref_image)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", list(DTYPES))
def test_packed_text_runs_on_flash_attn(precision, monkeypatch):
    _flash_attn_or_skip()
    reference, model = _gpu_models(64, precision)
    tokens, _ = _gpu_inputs()  # mixed lengths (and a full-length row): the packed path runs
    packed_calls = []
    original = FlashAttnBackend.attend_varlen

    def spy(self, q, k, v, cu_seqlens, max_seqlen, causal):
        packed_calls.append((q.shape[0], cu_seqlens.shape[0] - 1, max_seqlen, causal))
        return original(self, q, k, v, cu_seqlens, max_seqlen, causal)

    monkeypatch.setattr(FlashAttnBackend, "attend_varlen", spy)
    with torch.inference_mode():
        ref, stock = reference.encode_text(tokens), model.encode_text(tokens)
        with clip_flash.patched(model, "flash_attn") as report:
            out = model.encode_text(tokens)
    assert "packed variable-length attention (flash_attn)" in report.towers["text"], report.towers["text"]
    real_tokens = int((tokens.argmax(dim=-1) + 1).sum())
    assert packed_calls and all(call == (real_tokens, tokens.shape[0], 77, True) for call in packed_calls)
    _assert_within_rule(f"packed text {precision}", out, stock, ref)


@pytest.mark.gpu
def test_auto_follows_a_measured_table_for_this_gpu(tmp_path, monkeypatch):
    """A table saying sdpa:efficient wins at batch 4 and sdpa:flash at 256: auto runs exactly those."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("sdpa:flash needs compute capability >= 8.0")
    _, model = _gpu_models(64, "fp16")  # vision: 17 tokens, 2 heads of 64
    site = dict(dtype="float16", heads=2, head_dim=64)
    gpu, capability = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    path = write_table(tmp_path / "table.json", [
        entry(4, 17, {"sdpa:efficient": 0.01, "sdpa:cudnn": 0.5, "sdpa:flash": 0.5}, **site),
        entry(256, 17, {"sdpa:efficient": 0.5, "sdpa:cudnn": 0.5, "sdpa:flash": 0.01}, **site),
    ], gpu=gpu, capability=capability)
    attention_table.load_attention_table(path)
    ran = []
    original = SdpaBackend.attend

    def spy(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        ran.append((self.name, q.shape[0]))
        return original(self, q, k, v, causal, attn_mask, dropout_p)

    monkeypatch.setattr(SdpaBackend, "attend", spy)
    small = torch.randn(4, 3, 64, 64, device="cuda", dtype=torch.float16)
    large = torch.randn(256, 3, 64, 64, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        stock_small, stock_large = model.encode_image(small), model.encode_image(large)
        with clip_flash.patched(model) as report:
            ran.clear()
            out_small = model.encode_image(small)
            assert ran and set(ran) == {("sdpa:efficient", 4)}
            ran.clear()
            out_large = model.encode_image(large)
            assert ran and set(ran) == {("sdpa:flash", 256)}
    assert report.attention_table == f"measured table {path} ({gpu}, 2 entries)"
    vision = {site.backend for site in report.sites if site.tower == "vision"}
    assert vision == {"auto(measured: sdpa:efficient|sdpa:flash)"}, str(report)
    # No causal entries: the text sites keep the fixed order.
    assert {site.backend for site in report.sites if site.tower == "text"} == {"sdpa"}
    for out, stock in ((out_small, stock_small), (out_large, stock_large)):
        assert (1 - F.cosine_similarity(out.float(), stock.float(), dim=-1)).max().item() < 1e-3
