"""The facts the plain-ASCII route rests on, checked against the installed ftfy, html and OpenCLIP."""
from __future__ import annotations

import string

import numpy as np
import open_clip
import pytest

from clip_flash.inputs.text_cleaning import (PLAIN_WORD_PATTERN, all_plain_ascii, clean_plain_ascii, is_plain_ascii,
                                             plain_ascii_mask, split_plain_texts)

PLAIN_CHARS = [chr(c) for c in range(0x20, 0x7F) if chr(c) != "&"] + ["\t", "\n", "\r"]


def random_plain_texts(count: int, seed: int):
    """Printable ASCII without '&', with the shapes cleaning might react to (entity tails, tags, runs)."""
    rng = np.random.default_rng(seed)
    pieces = PLAIN_CHARS + ["#39;", "lt;", "amp;", "#x41;", "<b>", "</b>", "  ", "\r\n", "\t\t", "'s", "'T",
                            "[36m", "A", "Z", "0", "9"]
    texts = []
    for _ in range(count):
        picks = rng.integers(0, len(pieces), int(rng.integers(0, 40)))
        texts.append("".join(pieces[i] for i in picks))
    return texts


def test_plain_ascii_classification():
    allowed = set(PLAIN_CHARS)
    for code in range(0x3000):
        char = chr(code)
        assert is_plain_ascii(char) == (char in allowed), repr(char)
    assert is_plain_ascii("") and all_plain_ascii([]) and all_plain_ascii(["a", ""])
    assert not is_plain_ascii(b"bytes") and not all_plain_ascii(["a", None])
    texts = ["plain text", "café", "a&b", "tab\tok", "\x0b"]
    assert plain_ascii_mask(texts) == [True, False, False, True, False]
    assert not all_plain_ascii(texts)


def test_ftfy_leaves_plain_characters_alone():
    import ftfy
    for char in PLAIN_CHARS:
        text = f"a{char}b{char}"
        expected = text.replace("\r", "\n")  # fix_line_breaks: whitespace either way
        assert ftfy.fix_text(text) == expected, repr(char)


@pytest.mark.parametrize("seed", [0, 1])
def test_openclip_cleaning_is_whitespace_and_lowercase_on_plain_text(seed):
    clean = open_clip.get_tokenizer("ViT-L-14").clean_fn
    texts = random_plain_texts(50_000, seed) + ["".join(PLAIN_CHARS), string.printable.replace("&", "")[:95]]
    assert all(is_plain_ascii(text) for text in texts)
    ours = clean_plain_ascii(texts)
    for text, cleaned in zip(texts, ours):
        assert clean(text) == cleaned, repr(text)


def test_plain_split_matches_openclip_regex_on_cleaned_plain_text():
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    texts = clean_plain_ascii(random_plain_texts(50_000, 2) + ["".join(PLAIN_CHARS) * 3])
    for text in texts:
        assert PLAIN_WORD_PATTERN.findall(text) == openclip_tok.pat.findall(text), repr(text)
    expected = [word for text in texts for word in openclip_tok.pat.findall(text) + ["\x00"]]
    assert split_plain_texts(texts, "\x00") == expected
