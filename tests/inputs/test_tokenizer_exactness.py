"""Differential test: clip_flash's tokenizer gives OpenCLIP's ids (torch.equal) on large, varied corpora.

Run as a script for a bigger corpus than CI's:
    PYTHONPATH=. python tests/inputs/test_tokenizer_exactness.py --strings-per-generator 400000
"""
from __future__ import annotations

import argparse
import html.entities
import sys
import time
from typing import Callable, Dict, List, Sequence

import numpy as np
import open_clip
import pytest
import torch

from clip_flash.inputs.text.tokenizer import FastCLIPTokenizer, get_tokenizer

SEED = 20261123
# Random strings per generator in CI (42,500 in all; OpenCLIP's own tokenizer is the slow side, at
# 1,500-4,000 of these strings per second on one core); the slow run takes ten times as many, and the script
# mode below runs millions.
CI_STRINGS = {"ascii": 10_000, "code_points": 7_500, "sentences": 10_000, "entities": 6_250,
              "mixes": 5_000, "mojibake": 3_750}
SLOW_SCALE = 10

# Characters where cleaning, case mapping or Unicode tables are most likely to disagree.
WHITESPACE_LIKE = ("\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f"
                   "\u3000\u180e\u200b\ufeff\xad")
CASE_TRAPS = "İıßẞςσΣſKÅǅǈǋﬀﬁﬂﬃﬆ\u0345ΐΰŉǰẖẗẘẙẚ"
DIGITS = "0123456789０１２３٣४߁੧¹²³½Ⅻⅻ①𝟘𝟙"
COMBINING = "\u0300\u0301\u0308\u0327\u0345\u20dd\u036f\u0489"
SCRIPTS = "猫犬の日本語한국어中文字ひらがなカタカナｶﾀｶﾅ مرحبا بالعالم שלום עולם Привет мир Ελληνικά ไทย देवनागरी"
EMOJI = "😀👍🏽👨\u200d👩\u200d👧🇫🇷#\ufe0f\u20e3❤️✔™©®"
QUOTES = "‘’‚‛“”„‟ʼ′″«»–—…"
CONTROLS = ("".join(map(chr, list(range(0, 32)) + [127] + list(range(0x80, 0xA0))))
            + "\u200e\u200f\u202e\u2066\u206a\ufff9\ufffc")
INTERESTING = WHITESPACE_LIKE + CASE_TRAPS + DIGITS + COMBINING + SCRIPTS + EMOJI + QUOTES + CONTROLS
SPECIAL_SPELLINGS = ["<start_of_text>", "<end_of_text>", "<START_OF_TEXT>", "<End_Of_Text>", "<start_of_text",
                     "<<start_of_text>>", "<ſtart_of_text>", "start_of_text", "</w>"]
PUNCTUATION = list(".,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`") + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "...", "--"]
SEPARATORS = [" ", " ", " ", "  ", "\t", "\n", "\r\n", ", ", ". ", "-", "/", "&", " & ", "\xa0", ""]
ENTITY_NAMES = sorted(html.entities.html5)


def _words() -> List[str]:
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES
    return sorted({word for name in IMAGENET_CLASSNAMES for word in name.replace("-", " ").split()})


def _code_points_to_strings(rng: np.random.Generator, points: np.ndarray, count: int, max_len: int) -> List[str]:
    lengths = rng.integers(0, max_len + 1, size=count)
    points = points[: int(lengths.sum())]
    text = points.astype("<u4").tobytes().decode("utf-32-le")
    ends = np.cumsum(lengths)
    return [text[end - length:end] for end, length in zip(ends.tolist(), lengths.tolist())]


def random_code_points(rng: np.random.Generator, count: int) -> List[str]:
    """Code points over all planes (half of them from the BMP), surrogates excluded."""
    total = count * 25
    points = np.where(rng.random(total) < 0.5, rng.integers(0, 0x110000, total), rng.integers(0, 0x10000, total))
    points = np.where((points >= 0xD800) & (points < 0xE000), points - 0x800, points)
    return _code_points_to_strings(rng, points, count, 32)


def random_ascii(rng: np.random.Generator, count: int) -> List[str]:
    """Any ASCII, controls included, for a third of the strings; printable only (often without '&', so
    the plain route) for the rest."""
    strings = _code_points_to_strings(rng, rng.integers(0, 128, count * 40), count, 80)
    printable = _code_points_to_strings(rng, rng.integers(32, 127, count * 40), count, 80)
    return [a if i % 3 == 0 else b.replace("&", " ") if i % 3 == 1 else b
            for i, (a, b) in enumerate(zip(strings, printable))]


def random_sentences(rng: np.random.Generator, count: int) -> List[str]:
    """Caption-like: words in random case, punctuation, contractions, digits, entities, separators.
    Half of them plain ASCII without '&' (the plain route)."""
    words = _words()
    out = []
    for index in range(count):
        plain = index % 2 == 0
        parts = []
        for _ in range(int(rng.integers(0, 20))):
            kind = rng.random()
            if kind < 0.6:
                word = words[int(rng.integers(len(words)))]
                case = rng.random()
                word = word.upper() if case < 0.1 else word.title() if case < 0.25 else word
            elif kind < 0.8:
                word = PUNCTUATION[int(rng.integers(len(PUNCTUATION)))]
            elif kind < 0.9:
                word = str(int(rng.integers(0, 10 ** int(rng.integers(1, 8)))))
            elif kind < 0.96:
                word = "&" + ENTITY_NAMES[int(rng.integers(len(ENTITY_NAMES)))]
            else:
                word = SPECIAL_SPELLINGS[int(rng.integers(len(SPECIAL_SPELLINGS)))]
            parts.append(word + SEPARATORS[int(rng.integers(len(SEPARATORS)))])
        text = "".join(parts)
        out.append(_plain(text) if plain else text)
    return out


def _plain(text: str) -> str:
    """Printable ASCII without '&' (tab, newline and carriage return kept)."""
    return "".join(c if (" " <= c <= "~" and c != "&") or c in "\t\n\r" else " " for c in text)


def random_mixes(rng: np.random.Generator, count: int) -> List[str]:
    """Caption-like text with characters from the trap sets and random BMP characters sprinkled in."""
    base = random_sentences(rng, count)
    pool = list(INTERESTING)
    out = []
    for text in base:
        chars = list(text)
        for _ in range(int(rng.integers(0, 6))):
            insert = pool[int(rng.integers(len(pool)))] if rng.random() < 0.8 else chr(int(rng.integers(0xA0, 0xD800)))
            chars.insert(int(rng.integers(0, len(chars) + 1)), insert)
        out.append("".join(chars))
    return out


def random_mojibake(rng: np.random.Generator, count: int) -> List[str]:
    """UTF-8 text decoded as Windows-1252 or Latin-1 (once or twice): what ftfy repairs, or half-repairs."""
    base = random_mixes(rng, count)
    out = []
    for text in base:
        for _ in range(int(rng.integers(1, 3))):
            codec = "cp1252" if rng.random() < 0.6 else "latin-1"
            text = text.encode("utf-8", errors="surrogatepass").decode(codec, errors="replace")
        out.append(text)
    return out


def random_entities(rng: np.random.Generator, count: int) -> List[str]:
    """HTML entities, named (with and without ';'), numeric, hex, malformed, double-escaped."""
    words = _words()
    out = []
    for _ in range(count):
        parts = []
        for _ in range(int(rng.integers(1, 12))):
            kind = rng.random()
            if kind < 0.3:
                parts.append("&" + ENTITY_NAMES[int(rng.integers(len(ENTITY_NAMES)))])
            elif kind < 0.45:
                parts.append(f"&#{int(rng.integers(0, 0x11FFFF))};")
            elif kind < 0.55:
                parts.append(f"&#x{int(rng.integers(0, 0x11FFFF)):X};")
            elif kind < 0.65:
                parts.append("&amp;" + ENTITY_NAMES[int(rng.integers(len(ENTITY_NAMES)))])
            elif kind < 0.7:
                parts.append("&" + words[int(rng.integers(len(words)))].upper() + ";")
            else:
                parts.append(words[int(rng.integers(len(words)))])
            parts.append(SEPARATORS[int(rng.integers(len(SEPARATORS)))])
        out.append("".join(parts))
    return out


GENERATORS: Dict[str, Callable[[np.random.Generator, int], List[str]]] = {
    "code_points": random_code_points, "ascii": random_ascii, "sentences": random_sentences,
    "mixes": random_mixes, "mojibake": random_mojibake, "entities": random_entities,
}

EDGE_CASES = [
    "", " ", "   ", "\t", "\n\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u3000",
    "a  b", "a\tb", "a\nb", "a\rb", "a\x0bb", "a\x0cb", "a\x1cb", "a\x1db", "a\x85b", "a\xa0b", "a\u2028b",
    "  leading and trailing  ", "A Photo Of A DOG.", "it's", "IT'S", "we're", "you'll", "i'd've",
    "Tom &amp; Jerry", "it&#39;s", "&lt;b&gt;bold&lt;/b&gt;", "&amp;lt;", "&amp", "AT&T", "&", "&&", "&#x1F600;",
    "&nbsp;", "caf&eacute;", "P&EACUTE;REZ", "&notit;", "this&not that", "<b>&amp;</b>",
    "âœ” No problems", "sÃ³", "voilÃ le travail", "Ã©tÃ©", "â€œquotedâ€\x9d", "Ã\xa0 la",
    "\x00\x01\x02", "\x1b[36;44mblue\x1b[0m", "\x7f", "\x80\x81\x9f", "a\u200bb", "\ufeffbom",
    "😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "#\ufe0f\u20e3", "猫が好き", "中文 字", "한국어", "مرحبا بالعالم",
    "שלום", "e\u0301", "n\u0303", "\u0345", "\u0301", "ＬＯＵＤ　ＮＯＩＳＥＳ", "０１２３４５", "٣४", "½", "Ⅻ",
    "ﬁﬂ", "İstanbul", "ΣΊΣΥΦΟΣ", "ὈΔΥΣΣΕΎΣ", "Straße", "ẞ", "ſ", "K", "Å", "ǅ",
    "<start_of_text>", "<end_of_text>", "<START_OF_TEXT>", "a<start_of_text>b", "x<end_of_text>y<<start_of_text>",
    "<ſtart_of_text>", "<start_of_text", "start_of_text", "</w>", "a</w>", "\ud7ff", "\ue000", "\U0010ffff",
    "\ufffd", "\ufffe", "".join(["word "] * 200), "a" * 1000, "1234567890" * 20, "!" * 300, "'s" * 100,
    "supercalifragilisticexpialidocious", "x" * 76, "a b " * 37, "a b " * 38,
]


def imagenet_prompts() -> List[str]:
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES
    return [template(name) for name in IMAGENET_CLASSNAMES for template in OPENAI_IMAGENET_TEMPLATES]


def long_texts(rng: np.random.Generator, count: int) -> List[str]:
    """Texts of 60 to 400 tokens, so that every context length truncates some of them."""
    sentences = random_sentences(rng, count * 4)
    mixes = random_mixes(rng, count)
    return [" ".join(sentences[4 * i:4 * i + 4]) + (" " + mixes[i] if i % 3 == 0 else "") for i in range(count)]


def mismatches(openclip_tok, fast_tok, texts: Sequence[str], context_length=None, batch: int = 8192) -> List[str]:
    """Descriptions of every text whose ids differ (empty when all are identical)."""
    problems = []
    for start in range(0, len(texts), batch):
        chunk = list(texts[start:start + batch])
        expected = openclip_tok(chunk, context_length=context_length)
        got = fast_tok(chunk, context_length=context_length)
        if got.dtype != expected.dtype or got.shape != expected.shape:
            return [f"dtype/shape {got.dtype}{tuple(got.shape)} != OpenCLIP's {expected.dtype}{tuple(expected.shape)}"]
        if torch.equal(got, expected):
            continue
        for row in (got != expected).any(dim=1).nonzero().flatten().tolist():
            problems.append(f"{chunk[row]!r}: ours {got[row].tolist()} OpenCLIP {expected[row].tolist()}")
    return problems


@pytest.fixture(scope="module")
def tokenizers_pair():
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    fast_tok = get_tokenizer("ViT-L-14")
    assert isinstance(fast_tok, FastCLIPTokenizer)
    return openclip_tok, fast_tok


def _assert_identical(pair, texts, context_length=None):
    problems = mismatches(*pair, texts, context_length=context_length)
    assert not problems, f"{len(problems)} of {len(texts)} texts differ, first ones:\n" + "\n".join(problems[:10])


def test_imagenet_prompts_identical(tokenizers_pair):
    texts = imagenet_prompts()
    assert len(texts) == 80_000
    _assert_identical(tokenizers_pair, texts)


def test_edge_cases_identical(tokenizers_pair):
    _assert_identical(tokenizers_pair, EDGE_CASES)
    for text in EDGE_CASES:  # one at a time too: a lone str, and batches of one
        assert torch.equal(tokenizers_pair[1](text), tokenizers_pair[0](text)), repr(text)


@pytest.mark.parametrize("context_length", [2, 3, 5, 16, 32, 64, 76, 77, 128])
def test_truncation_identical(tokenizers_pair, context_length):
    rng = np.random.default_rng(SEED + context_length)
    _assert_identical(tokenizers_pair, long_texts(rng, 300) + EDGE_CASES, context_length=context_length)


def test_context_length_one_is_openclips(tokenizers_pair):
    _assert_identical(tokenizers_pair, EDGE_CASES[:20], context_length=1)


@pytest.mark.parametrize("scale", [pytest.param(1, id="ci"),
                                   pytest.param(SLOW_SCALE, id="large", marks=pytest.mark.slow)])
@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_random_strings_identical(tokenizers_pair, generator, scale):
    rng = np.random.default_rng([SEED, sorted(GENERATORS).index(generator), scale])
    texts = GENERATORS[generator](rng, CI_STRINGS[generator] * scale)
    before = dict(tokenizers_pair[1].route_counts)
    started = time.perf_counter()
    _assert_identical(tokenizers_pair, texts)
    routes = {k: v - before[k] for k, v in tokenizers_pair[1].route_counts.items()}
    print(f"{generator}: {len(texts)} strings identical in {time.perf_counter() - started:.1f} s; routes {routes}")


def test_every_route_is_exercised(tokenizers_pair):
    """The corpora above must reach every route, or the test proves less than it claims. ``cleaned`` is
    where the ftfy replay is refused (another ftfy version): forced here on a second tokenizer."""
    openclip_tok, fast_tok = tokenizers_pair
    texts = imagenet_prompts()[:100] + EDGE_CASES
    fast_tok(texts)
    assert all(fast_tok.route_counts[route] > 0 for route in ("plain", "replayed")), fast_tok.route_counts
    refused = FastCLIPTokenizer(openclip_tok)
    refused.replay = False
    assert torch.equal(refused(texts), openclip_tok(texts))
    assert refused.route_counts["cleaned"] > 0
    with pytest.raises(Exception):  # a non-str: OpenCLIP's own tokenizer raises, as it would
        fast_tok(["ok", None])
    assert fast_tok.route_counts["openclip"] > 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strings-per-generator", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=SEED + 1)
    args = parser.parse_args(argv)
    pair = (open_clip.get_tokenizer("ViT-L-14"), get_tokenizer("ViT-L-14"))
    total, failed = 0, 0
    for index, name in enumerate(sorted(GENERATORS)):
        rng = np.random.default_rng([args.seed, index])
        texts = GENERATORS[name](rng, args.strings_per_generator)
        started = time.perf_counter()
        problems = mismatches(*pair, texts)
        total += len(texts)
        failed += len(problems)
        print(f"{name}: {len(texts)} strings, {len(problems)} differ ({time.perf_counter() - started:.0f} s)")
        for problem in problems[:10]:
            print("   ", problem)
    for context_length in (16, 32, 77):
        texts = long_texts(np.random.default_rng([args.seed, 99, context_length]), 20_000)
        problems = mismatches(*pair, texts, context_length=context_length)
        total += len(texts)
        failed += len(problems)
        print(f"long texts, context {context_length}: {len(texts)} strings, {len(problems)} differ")
    print(f"total {total} strings, {failed} differ; routes {pair[1].route_counts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
