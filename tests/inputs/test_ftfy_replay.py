"""The replayed ftfy cleaning is ftfy's: same fixed text, same OpenCLIP cleaning, same token ids.

Run as a script for millions of strings (cleaning compared on all of them, ids on a share):
    PYTHONPATH=. python tests/inputs/test_ftfy_replay.py --strings-per-generator 1000000
"""
from __future__ import annotations

import argparse
import sys
import time

import ftfy
import numpy as np
import open_clip
import pytest
import torch
from ftfy.badness import is_bad
from unicode_corpus import UNICODE_GENERATORS, badness_characters

from clip_flash.inputs.text.ftfy_replay import (_CHARACTER_FIXERS, badness_triggers, fixer_trigger_characters,
                                           fixer_triggers, is_bad_in_windows, replay_basic_clean, replay_fix_text,
                                           replay_refusal)
from clip_flash.inputs.text.tokenizer import FastCLIPTokenizer

SEED = 20261124
# Strings per generator in CI (cleaning compared on all; ids on IDS_SHARE of them); the slow run takes ten
# times as many, the script mode millions.
CI_STRINGS = 5_000
SLOW_SCALE = 10
IDS_SHARE = 4

pytestmark = pytest.mark.skipif(replay_refusal() is not None, reason=f"replay refused: {replay_refusal()}")


def _corpus(name: str, count: int, seed: int = SEED):
    rng = np.random.default_rng([seed, sorted(UNICODE_GENERATORS).index(name)])
    return UNICODE_GENERATORS[name](rng, count)


def cleaning_mismatches(texts, clean_fn):
    """Texts where the replay's fix_text or OpenCLIP cleaning differs from ftfy's / OpenCLIP's."""
    bad = []
    for text in texts:
        fixed = replay_fix_text(text)
        if fixed is None:  # only texts over ftfy's segment length; none here
            bad.append((text, "not replayed"))
        elif fixed != ftfy.fix_text(text):
            bad.append((text, fixed))
        elif " ".join(replay_basic_clean(text).split()).lower() != clean_fn(text):
            bad.append((text, "clean_fn differs"))
    return bad


def test_installed_ftfy_is_replayed():
    assert replay_refusal() is None
    assert badness_triggers() is not None and badness_triggers()[1] <= 16


def test_character_fixers_touch_only_trigger_characters():
    """Each fixer leaves alone every other code point of the BMP and a sample of the other planes: alone,
    doubled, between letters, and all of them in one string."""
    rng = np.random.default_rng(SEED)
    points = list(range(0x10000)) + rng.integers(0x10000, 0x110000, 20_000).tolist()
    for name in _CHARACTER_FIXERS:
        fixer, touched = ftfy.FIXERS[name], fixer_triggers()[name]
        others = [chr(point) for point in points if chr(point) not in touched]
        for text in ("".join(others), "a".join(others), "".join(char * 2 for char in others)):
            assert fixer(text) == text, name
        for char in others[::97]:
            assert fixer(char) == char, (name, hex(ord(char)))
    # The sets are no decoys: each fixer changes some of its characters (ESC needs a whole sequence).
    assert {name for name in _CHARACTER_FIXERS
            if any(ftfy.FIXERS[name](char) != char for char in fixer_triggers()[name])} == set(_CHARACTER_FIXERS) - {
                "remove_terminal_escapes"}
    for char in "\r\u2028\u2029\x85\x1b\x00\x9d\u2019\u201c\ufb01\uff21\u3000\ud800\ufeff":
        assert char in fixer_trigger_characters(), hex(ord(char))


@pytest.mark.parametrize("name", ["badness_chars", "near_mojibake", "typography"])
def test_windowed_badness_is_ftfys(name):
    texts = _corpus(name, 40_000)
    texts += [badness_characters()[i:i + 9] for i in range(len(badness_characters()))]
    differ = [text for text in texts if is_bad_in_windows(text) != is_bad(text)]
    assert not differ, [repr(text) for text in differ[:10]]
    assert sum(map(is_bad, texts)) > len(texts) // 20  # the corpus does reach the bad side


@pytest.mark.parametrize("scale", [pytest.param(1, id="ci"),
                                   pytest.param(SLOW_SCALE, id="large", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(UNICODE_GENERATORS))
def test_replayed_cleaning_and_ids_are_openclips(name, scale):
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    texts = _corpus(name, CI_STRINGS * scale)
    bad = cleaning_mismatches(texts, openclip_tok.clean_fn)
    assert not bad, bad[:10]
    fast_tok = FastCLIPTokenizer(openclip_tok)
    subset = texts[::IDS_SHARE]
    assert torch.equal(fast_tok(subset), openclip_tok(subset))
    assert fast_tok.route_counts["replayed"] > 0 and fast_tok.route_counts["cleaned"] == 0


def test_segments_and_sticky_html_switch():
    """fix_text's segments: '<' in one line turns HTML unescaping off for the lines after it."""
    texts = ["&amp;\n<b>&amp;\n&amp;", "<\n&amp;", "&amp;\n&lt;\n&amp;", "Ã \nÃ \n", "\n\n&eacute;\n", "a\n",
             "\n", "x\r\ny\u2028z", "café\n“q”\n&quot;", "Ã©\nÃ©", "<" + "&amp;" * 3]
    bad = cleaning_mismatches(texts, open_clip.get_tokenizer("ViT-L-14").clean_fn)
    assert not bad, bad


def test_refused_replay_falls_back_to_openclips_cleaning():
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    fast_tok = FastCLIPTokenizer(openclip_tok)
    fast_tok.replay = False  # what a different ftfy version gets
    texts = _corpus("typography", 300)
    assert torch.equal(fast_tok(texts), openclip_tok(texts))
    assert fast_tok.route_counts["replayed"] == 0 and fast_tok.route_counts["cleaned"] > 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strings-per-generator", type=int, default=1_000_000)
    parser.add_argument("--ids-share", type=int, default=10, help="compare ids on every N-th string")
    parser.add_argument("--seed", type=int, default=SEED + 1)
    args = parser.parse_args(argv)
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    fast_tok = FastCLIPTokenizer(openclip_tok)
    total = failed = ids_total = 0
    for name in sorted(UNICODE_GENERATORS):
        started = time.perf_counter()
        texts = _corpus(name, args.strings_per_generator, args.seed)
        bad = cleaning_mismatches(texts, openclip_tok.clean_fn)
        windows = sum(1 for text in texts if is_bad_in_windows(text) != is_bad(text))
        subset = texts[::args.ids_share]
        id_rows = 0
        for start in range(0, len(subset), 8192):
            batch = subset[start:start + 8192]
            id_rows += int((fast_tok(batch) != openclip_tok(batch)).any(dim=1).sum())
        total += len(texts)
        ids_total += len(subset)
        failed += len(bad) + windows + id_rows
        print(f"{name}: {len(texts)} strings, cleaning differs on {len(bad)}, windowed is_bad on {windows}; "
              f"ids of {len(subset)} differ on {id_rows} ({time.perf_counter() - started:.0f} s)", flush=True)
        for text, got in bad[:5]:
            print("   ", repr(text), repr(got))
    print(f"total {total} strings ({ids_total} tokenized), {failed} differ; routes {fast_tok.route_counts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
