"""The facts the plain-ASCII route rests on, checked against the installed ftfy, html and OpenCLIP."""
from __future__ import annotations

import string

import numpy as np
import open_clip
import pytest

from clip_flash.inputs.text_cleaning import (PLAIN_WORD_PATTERN, all_plain_ascii, is_plain_ascii, lowered_plain_batch,
                                             plain_ascii_mask, split_plain_texts)

# Plain text: these characters, and "&" only before a space or at the end.
PLAIN_CHARS = [chr(c) for c in range(0x20, 0x7F) if chr(c) != "&"] + ["\t", "\n", "\r"]


def random_plain_texts(count: int, seed: int):
    """Plain texts, with the shapes cleaning might react to (entity tails, tags, runs, '& ')."""
    rng = np.random.default_rng(seed)
    pieces = PLAIN_CHARS + ["#39;", "lt;", "amp;", "#x41;", "<b>", "</b>", "  ", "\r\n", "\t\t", "'s", "'T",
                            "[36m", "A", "Z", "0", "9", "& ", " & ", "&  ", "& amp;", "& #39;", "& lt;"]
    texts = []
    for _ in range(count):
        picks = rng.integers(0, len(pieces), int(rng.integers(0, 40)))
        text = "".join(pieces[i] for i in picks)
        texts.append(text + "&" if rng.random() < 0.05 else text)
    return texts


def test_plain_ascii_classification():
    allowed = set(PLAIN_CHARS)
    for code in range(0x3000):
        char = chr(code)
        assert is_plain_ascii(char) == (char in allowed or char == "&"), repr(char)
        assert is_plain_ascii(f"a{char}b") == (char in allowed), repr(char)
        assert is_plain_ascii(f"&{char}") == (char == " "), repr(char)
    assert is_plain_ascii("") and all_plain_ascii([]) and all_plain_ascii(["a", ""])
    assert not is_plain_ascii(b"bytes") and not all_plain_ascii(["a", None])
    texts = ["plain text", "café", "a&b", "tab\tok", "\x0b", "Tom & Jerry", "R&amp;D", "rock &", "&\n", "& "]
    assert plain_ascii_mask(texts) == [True, False, False, True, False, True, False, True, False, True]
    assert not all_plain_ascii(texts)
    assert all_plain_ascii(["Tom & Jerry", "rock & roll", "ends in &"[:-1]])
    assert not all_plain_ascii(["ends in &", "next"])  # joined, the "&" meets "\n": checked one by one


def test_ftfy_leaves_plain_characters_alone():
    import ftfy
    for char in PLAIN_CHARS:
        for text in (f"a{char}b{char}", f"& {char}&", f"{char}& {char};&"):
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
def test_plain_split_gives_openclips_words(seed):
    """The whole claim at once: one scan of the lower-cased batch == OpenCLIP's clean + split per text."""
    openclip_tok = open_clip.get_tokenizer("ViT-L-14")
    texts = random_plain_texts(50_000, seed) + ["".join(PLAIN_CHARS) * 3, "", "   ", "I'M 'S 'RE"]
    expected = [word for text in texts for word in openclip_tok.pat.findall(openclip_tok.clean_fn(text)) + ["\x00"]]
    assert split_plain_texts(lowered_plain_batch(texts, "\x00")) == expected
    for text in texts[:5000]:  # and text by text, for a readable failure
        assert PLAIN_WORD_PATTERN.findall(text.lower()) == openclip_tok.pat.findall(openclip_tok.clean_fn(text)), \
            repr(text)
