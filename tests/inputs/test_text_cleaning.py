"""The facts the plain route and the batch chunking rest on, checked against the installed ftfy, html, Python
and OpenCLIP."""
from __future__ import annotations

import string

import numpy as np
import open_clip
import pytest

from clip_flash.inputs.text.text_cleaning import fast_chunks, is_plain_ascii, suspect_rows

# Plain text: these characters only.
PLAIN_CHARS = [chr(c) for c in range(0x20, 0x7F) if chr(c) != "&"] + ["\t", "\n", "\r"]


def random_plain_texts(count: int, seed: int):
    """Plain texts, with the shapes cleaning might react to (entity tails, tags, runs, special spellings)."""
    rng = np.random.default_rng(seed)
    pieces = PLAIN_CHARS + ["#39;", "lt;", "amp;", "#x41;", "<b>", "</b>", "  ", "\r\n", "\t\t", "'s", "'T",
                            "[36m", "A", "Z", "0", "9", "; ", " # ", "<start_of_text>", "<END_OF_TEXT>"]
    texts = []
    for _ in range(count):
        picks = rng.integers(0, len(pieces), int(rng.integers(0, 40)))
        text = "".join(pieces[i] for i in picks)
        texts.append(text)
    return texts


def test_plain_ascii_classification():
    allowed = set(PLAIN_CHARS)
    for code in range(0x3000):
        char = chr(code)
        assert is_plain_ascii(char) == (char in allowed), repr(char)
        assert is_plain_ascii(f"a{char}b") == (char in allowed), repr(char)
    assert is_plain_ascii("") and not is_plain_ascii("Tom & Jerry") and not is_plain_ascii(b"bytes")
    texts = ["plain text", "café", "a&b", "tab\tok", "\x0b", "Tom & Jerry", "R&amp;D", "", "x\n", "日本"]
    assert suspect_rows(texts) == [row for row, text in enumerate(texts) if not is_plain_ascii(text)]
    assert suspect_rows(["a", "b"]) == [] and suspect_rows([]) == []


def test_suspect_rows_match_the_per_text_rule():
    rng = np.random.default_rng(5)
    texts = random_plain_texts(20_000, 5)
    for row in rng.integers(0, len(texts), 700).tolist():
        texts[row] = texts[row] + chr(int(rng.integers(0x80, 0x3000))) if row % 2 else texts[row] + "&"
    assert suspect_rows(texts) == [row for row, text in enumerate(texts) if not is_plain_ascii(text)]


def test_ftfy_leaves_plain_characters_alone():
    import ftfy
    for char in PLAIN_CHARS:
        for text in (f"a{char}b{char}", f"{char};{char}#", f"<{char}>"):
            expected = text.replace("\r", "\n")  # fix_line_breaks: whitespace either way
            assert ftfy.fix_text(text) == expected, repr(text)


@pytest.mark.parametrize("seed", [0, 1])
def test_openclip_cleaning_is_whitespace_and_lowercase_on_plain_text(seed):
    clean = open_clip.get_tokenizer("ViT-L-14").clean_fn
    texts = random_plain_texts(50_000, seed) + ["".join(PLAIN_CHARS), string.printable.replace("&", "")[:95]]
    assert all(is_plain_ascii(text) for text in texts)
    for text in texts:
        assert clean(text) == " ".join(text.split()).lower(), repr(text)


@pytest.mark.parametrize("seed", [2, 3])
def test_fast_chunks_give_openclips_words(seed):
    """The whole claim at once: chunks of the lower-cased batch, split with OpenCLIP's pattern, are
    OpenCLIP's words of each cleaned text (plain texts here; the tokenizer tests cover the rest)."""
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    texts = random_plain_texts(50_000, seed) + ["".join(PLAIN_CHARS) * 3, "", "   ", "I'M 'S 'RE"]
    expected = [word for text in texts for word in openclip_tok.pat.findall(openclip_tok.clean_fn(text)) + ["\x00"]]
    got = [word for chunk in fast_chunks(texts, "\x00") for word in openclip_tok.pat.findall(chunk)]
    assert got == expected


def test_lower_case_and_whitespace_facts_over_all_code_points():
    """What fast_chunks needs from str.lower and str.split, for every code point: whitespace lower-cases to
    itself and bounds the final-sigma context; nothing else lower-cases to whitespace or to NUL."""
    for code in range(0x110000):
        char = chr(code)
        lowered = char.lower()
        if char.isspace():
            assert lowered == char, hex(code)
            assert ("A" + char + "\u03a3").lower()[-1] == "\u03c3", hex(code)  # not cased-ignorable backwards
            assert ("A\u03a3" + char + "B").lower()[1] == "\u03c2", hex(code)  # nor forwards
        else:
            assert not any(part.isspace() for part in lowered), hex(code)
            assert "\x00" not in lowered or code == 0, hex(code)
    assert "\x00".lower() == "\x00" and not "\x00".isspace()
