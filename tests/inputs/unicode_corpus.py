"""Non-ASCII caption corpora aimed at the replayed ftfy cleaning (``clip_flash.inputs.text.ftfy_replay``).

Each generator takes a numpy Generator and a count and returns that many strings: accented Latin captions,
CJK and other scripts, mixed scripts, near-mojibake (text that looks like, or is, UTF-8 read as a
single-byte encoding), typography that ftfy rewrites (curly quotes, ligatures, full-width forms, NBSP,
line separators), combining marks, and random strings drawn from the characters ftfy's badness heuristic
looks at and from the non-ASCII characters no fixer touches.
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List

import numpy as np

CAPTION_WORDS = ("a photo of the dog on beach in city with red old small house near lake at sunset "
                 "woman man child car street view black white image free stock 2019 4K").split()
ACCENTED = ("café naïve été Müller São Paulo Ærø Øresund Ångström Ŝerpa Łódź Čeština Dvořák façade crème brûlée "
            "jalapeño señor über Straße Åland Ísland Þórr résumé déjà vu Bogotá Málaga Zürich Kraków İzmir "
            "Ελληνικά Ἀθῆναι Москва Київ Ռուսաստան ქართული").split()
SCRIPTS = ("猫 犬 日本語 東京 写真 中文 北京 한국어 서울 ひらがな カタカナ ｶﾀｶﾅ مرحبا القاهرة שלום ירושלים ไทย "
           "देवनागरी বাংলা தமிழ் ಕನ್ನಡ ລາວ ᠮᠣᠩᠭᠣᠯ ትግርኛ ᏣᎳᎩ").split()
TYPOGRAPHY = list("‘’‚‛“”„‟ʼ′″«»–—…•·°±×÷©®™€£¥¢½¼¾¹²³ªº§¶†‡‰") + [
    "\xa0", "\u2009", "\u202f", "\u3000", "\u2028", "\u2029", "\x85", "\u200b", "\u200d", "\ufeff", "\xad",
    "ﬁ", "ﬂ", "ﬀ", "ﬃ", "ĳ", "ǆ", "ŉ", "ＡＢＣ", "ｆｕｌｌ", "０１２", "！？", "ﾊﾟｰﾄ", "\u0301", "\u0308",
    "\u0327", "\u0345", "\u20dd", "e\u0301", "A\u030a", "\u1e9e", "ς", "Σ", "İ", "ı", "K", "Ω", "\ud83d",
    "\U0001F600", "👍🏽", "❤️", "🇫🇷", "\x1b[1m", "\x7f", "\x9d", "\x81", "&amp;", "&quot;", "&#8217;",
    "&eacute;", "&nbsp;", "&lt;", "<", "&", "&notit;", "\r\n", "\r", "\n", "\t"]


@functools.lru_cache(maxsize=None)
def badness_characters() -> str:
    """Every non-ASCII character ftfy's badness pattern names, plus the Latin-1 and C1 range."""
    from ftfy.badness import BADNESS_RE
    named = {char for char in BADNESS_RE.pattern if ord(char) >= 0x80}
    return "".join(sorted(named | {chr(code) for code in range(0x80, 0x100)}))


@functools.lru_cache(maxsize=None)
def untouched_characters() -> np.ndarray:
    """Code points (non-ASCII, all planes) that no ftfy character fixer touches."""
    from clip_flash.inputs.text.ftfy_replay import fixer_trigger_characters
    excluded = np.fromiter((ord(char) for char in fixer_trigger_characters()), dtype=np.int64)
    points = np.arange(0x80, 0x110000, dtype=np.int64)
    return points[~np.isin(points, excluded)]


def _pick(rng: np.random.Generator, items) -> str:
    return items[int(rng.integers(len(items)))]


def _caption(rng: np.random.Generator, vocabulary, share: float) -> str:
    words = [_pick(rng, vocabulary) if rng.random() < share else _pick(rng, CAPTION_WORDS)
             for _ in range(int(rng.integers(1, 18)))]
    if rng.random() < 0.3:
        words = [word.upper() if rng.random() < 0.5 else word.title() for word in words]
    separators = [" ", " ", " ", ", ", ". ", " - ", "  ", "\t", "\n", "\xa0", "/"]
    return "".join(word + _pick(rng, separators) for word in words).strip(" ")


def accented_captions(rng: np.random.Generator, count: int) -> List[str]:
    return [_caption(rng, ACCENTED, 0.4) for _ in range(count)]


def script_captions(rng: np.random.Generator, count: int) -> List[str]:
    return [_caption(rng, SCRIPTS + ACCENTED, 0.5) for _ in range(count)]


def typography_captions(rng: np.random.Generator, count: int) -> List[str]:
    """Captions with characters ftfy rewrites, or that sit next to what it rewrites, inserted."""
    out = []
    for _ in range(count):
        chars = list(_caption(rng, ACCENTED + SCRIPTS, 0.2))
        for _ in range(int(rng.integers(1, 6))):
            chars.insert(int(rng.integers(0, len(chars) + 1)), _pick(rng, TYPOGRAPHY))
        out.append("".join(chars))
    return out


def near_mojibake(rng: np.random.Generator, count: int) -> List[str]:
    """Real mojibake (UTF-8 read as a single-byte code page, once or twice, sometimes with the NBSP byte
    turned into a space), and captions sprinkled with mojibake-looking characters."""
    codecs = ["cp1252", "latin-1", "cp1251", "cp1250", "cp1253", "cp1254", "cp1257", "iso-8859-2", "mac_roman",
              "cp437"]
    out = []
    for index in range(count):
        text = _caption(rng, ACCENTED + SCRIPTS + TYPOGRAPHY[:40], 0.4)
        if index % 2 == 0:
            for _ in range(int(rng.integers(1, 3))):
                text = text.encode("utf-8", "surrogatepass").decode(_pick(rng, codecs), "replace")
            if rng.random() < 0.3:
                text = text.replace("\xa0", " ")
        else:
            chars = list(text)
            for _ in range(int(rng.integers(1, 8))):
                chars.insert(int(rng.integers(0, len(chars) + 1)), _pick(rng, badness_characters()))
            text = "".join(chars)
        out.append(text)
    return out


def random_badness_strings(rng: np.random.Generator, count: int) -> List[str]:
    """Short strings of badness characters, ASCII letters, digits, spaces and newlines."""
    alphabet = badness_characters() + "aeiouxyzAEOXZ019 .,?!\n\xa0"
    lengths = rng.integers(0, 16, count)
    picks = rng.integers(0, len(alphabet), int(lengths.sum()))
    text = "".join(alphabet[i] for i in picks.tolist())
    ends = np.cumsum(lengths).tolist()
    return [text[end - length:end] for end, length in zip(ends, lengths.tolist())]


def random_untouched_strings(rng: np.random.Generator, count: int) -> List[str]:
    """Random strings of non-ASCII characters no fixer touches (all planes), with ASCII words and spaces."""
    points = untouched_characters()
    out = []
    for _ in range(count):
        chars = [chr(int(points[i])) for i in rng.integers(0, len(points), int(rng.integers(0, 12)))]
        for _ in range(int(rng.integers(0, 4))):
            chars.insert(int(rng.integers(0, len(chars) + 1)), " " + _pick(rng, CAPTION_WORDS) + " ")
        out.append("".join(chars))
    return out


UNICODE_GENERATORS: Dict[str, Callable[[np.random.Generator, int], List[str]]] = {
    "accented": accented_captions, "scripts": script_captions, "typography": typography_captions,
    "near_mojibake": near_mojibake, "badness_chars": random_badness_strings,
    "untouched_chars": random_untouched_strings,
}
