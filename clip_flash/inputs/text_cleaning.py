"""Which captions OpenCLIP's text cleaning provably leaves alone, and how to split those into words.

OpenCLIP's ``SimpleTokenizer`` with ``clean='lower'`` computes, per text,
``whitespace_clean(basic_clean(text)).lower()``, where ``basic_clean`` is ``ftfy.fix_text``, then
``html.unescape`` twice, then ``strip``. That costs tens of microseconds per caption in Python. Call a text
*plain* when it holds only printable ASCII (0x20-0x7E), tab, newline and carriage return, and every ``&``
in it is followed by a space or ends the text ("Tom & Jerry"). On a plain text every step but whitespace
collapsing and lower-casing is the identity:

- ``ftfy.fix_text`` (ftfy 6, default config), step by step: ``unescape_html`` rewrites only matches of
  ``&#?[0-9A-Za-z]{1,24};`` (an ``&`` followed by ``#`` or a letter or digit); ``fix_encoding`` returns
  text that fits in ASCII unchanged; ``fix_c1_controls`` touches U+0080-U+009F; the ligature,
  character-width, curly-quote and surrogate fixers map only non-ASCII code points;
  ``remove_terminal_escapes`` needs ESC (0x1B); ``remove_control_chars`` deletes 0x00-0x08, 0x0B,
  0x0E-0x1F and 0x7F, none of which is allowed; ``fix_line_breaks`` turns ``\\r`` into ``\\n``
  (whitespace either way, collapsed below); NFC leaves ASCII unchanged. ``tests/inputs/test_text_cleaning.py``
  checks these facts against the installed ftfy, so an ftfy upgrade that breaks them fails the tests
  rather than the ids.
- ``html.unescape`` rewrites only an ``&`` followed by ``#`` or by a character other than tab, newline,
  form feed, space, ``<``, ``&``, ``#`` and ``;``: never one followed by a space or ending the text.
- What remains is ``" ".join(text.split()).lower()``: whitespace runs to one space, and lower case.

Then OpenCLIP splits with its pattern (``regex`` module, IGNORECASE). On lower-case printable ASCII,
``\\p{L}`` is ``[a-z]``, ``\\p{N}`` is ``[0-9]``, and tab, newline, carriage return and space are all
``\\s``; no alternative matches or crosses whitespace, so collapsing whitespace cannot change the words.
Hence the words of a plain text are ``PLAIN_WORD_PATTERN.findall(text.lower())``: OpenCLIP's pattern
restricted to that alphabet, its alternatives reordered where they cannot compete (they start with
different characters), run by Python's own ``re`` over a whole batch at once (``split_plain_texts``). The
tests compare this with OpenCLIP's ``pat.findall(clean_fn(text))`` on large corpora. The one plain case
left is a text that spells a special token (``<start_of_text>``/``<end_of_text>``, any case): OpenCLIP
turns it into the special id mid-text, so such texts go through OpenCLIP's own code
(``spells_special_token``; whitespace collapsing cannot create or break such a spelling).
"""
from __future__ import annotations

import re
from typing import List, Sequence

# Anything outside printable ASCII, tab, newline and carriage return, or an "&" followed by anything but a
# space, sends a text through OpenCLIP's cleaning.
_OUTSIDE_PLAIN_ASCII = re.compile(r"[^\t\n\r\x20-\x7e]|&(?=[^ ])")
SPECIAL_TOKEN_TEXTS = ("<start_of_text>", "<end_of_text>")
# OpenCLIP's split pattern on lower-cased plain text (see the module docstring).
PLAIN_WORD_PATTERN = re.compile(r"""[a-z]+|[0-9]|'(?:s|t|re|ve|m|ll|d)|[^\sa-z0-9]+""")


def is_plain_ascii(text: object) -> bool:
    """True when OpenCLIP's cleaning of ``text`` is only whitespace collapsing and lower-casing."""
    return isinstance(text, str) and _OUTSIDE_PLAIN_ASCII.search(text) is None


def all_plain_ascii(texts: Sequence[object]) -> bool:
    """``is_plain_ascii`` for every text at once: one scan of the joined batch, the common case."""
    if not all(isinstance(text, str) for text in texts):
        return False
    # Joining with "\n" cannot hide a disallowed character; it can only flag a text that ends in "&",
    # which then gets the per-text check.
    return _OUTSIDE_PLAIN_ASCII.search("\n".join(texts)) is None  # type: ignore[arg-type]


def plain_ascii_mask(texts: Sequence[object]) -> List[bool]:
    """Per text: whether it may skip OpenCLIP's cleaning (see the module docstring)."""
    return [is_plain_ascii(text) for text in texts]


def lowered_plain_batch(texts: Sequence[str], boundary: str) -> str:
    """The plain texts joined, each followed by `` boundary ``, lower-cased: one string for one scan.

    ``boundary`` must be a character no plain text holds and the pattern keeps as a word of its own (a
    control character, between spaces).
    """
    separator = f" {boundary} "
    return (separator.join(texts) + separator).lower() if texts else ""


def split_plain_texts(lowered_batch: str) -> List[str]:
    """OpenCLIP's words of every text in a ``lowered_plain_batch``, each text's followed by the boundary."""
    return PLAIN_WORD_PATTERN.findall(lowered_batch)


def spells_special_token(lowered_text: str) -> bool:
    """True when a lower-cased text contains a special token's spelling."""
    return any(special in lowered_text for special in SPECIAL_TOKEN_TEXTS)
