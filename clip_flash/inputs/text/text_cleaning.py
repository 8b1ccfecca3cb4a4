"""Which captions skip OpenCLIP's text cleaning, and how their cleaned chunks are cut for a whole batch.

OpenCLIP's ``SimpleTokenizer`` with ``clean='lower'`` computes, per text,
``whitespace_clean(basic_clean(text)).lower()``, where ``basic_clean`` is ``ftfy.fix_text``, then
``html.unescape`` twice, then ``strip``. That costs tens of microseconds per caption in Python. Call a text
*plain* when it holds only printable ASCII (0x20-0x7E) other than ``&``, tab, newline and carriage return.
On a plain text every step but whitespace collapsing and lower-casing is the identity:

- ``ftfy.fix_text`` (ftfy 6, default config), step by step: ``unescape_html`` rewrites only matches of
  ``&#?[0-9A-Za-z]{1,24};``; ``fix_encoding`` returns text that fits in ASCII unchanged;
  ``fix_c1_controls`` touches U+0080-U+009F; the ligature, character-width, curly-quote and surrogate
  fixers map only non-ASCII code points; ``remove_terminal_escapes`` needs ESC (0x1B);
  ``remove_control_chars`` deletes 0x00-0x08, 0x0B, 0x0E-0x1F and 0x7F, none of which is allowed;
  ``fix_line_breaks`` turns ``\\r`` into ``\\n`` (whitespace either way, collapsed below); NFC leaves
  ASCII unchanged. ``tests/inputs/test_text_cleaning.py`` checks these facts against the installed ftfy.
- ``html.unescape`` returns a text without ``&`` unchanged.
- What remains is ``" ".join(text.split()).lower()``: whitespace runs to one space, and lower case.

Every other text is a *suspect*: ``cleaning_identity.cleaning_is_identity`` proves many of them (accented
or non-Latin text, ``&`` that is no entity) unchanged by ftfy and html too; the rest take OpenCLIP's own
cleaning.

The texts known to clean to ``" ".join(text.split()).lower()`` are then cut into chunks all at once:
``fast_chunks`` lower-cases the batch joined with `` boundary `` and splits it at whitespace. That equals
lower-casing each collapsed text and splitting it at its spaces because every whitespace character is
its own lower case and is neither cased nor case-ignorable (the only context ``str.lower`` looks at, for
the Greek final sigma, stops at it), and no other character lower-cases to whitespace or to the
boundary (checked over all code points in the tests).
"""
from __future__ import annotations

import re
from typing import List, Sequence

import numpy as np

# Anything outside printable ASCII other than "&", tab, newline and carriage return makes a text a suspect.
_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x25\x27-\x7e]")
SPECIAL_TOKEN_TEXTS = ("<start_of_text>", "<end_of_text>")


def is_plain_ascii(text: object) -> bool:
    """True when OpenCLIP's cleaning of ``text`` is only whitespace collapsing and lower-casing, by the
    character rule of the module docstring."""
    return isinstance(text, str) and _NOT_PLAIN.search(text) is None


def suspect_rows(texts: Sequence[str]) -> List[int]:
    """Indices of the texts (all ``str``) that are not plain: one scan of the newline-joined batch."""
    joined = "\n".join(texts)
    positions = [match.start() for match in _NOT_PLAIN.finditer(joined)]
    if not positions:
        return []
    # Text i spans [ends[i] - len(text i) - 1, ends[i] - 1) of the joined string, its "\n" at ends[i] - 1.
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)) + 1)
    return np.unique(np.searchsorted(ends, positions, side="right")).tolist()


def fast_chunks(texts: Sequence[str], boundary: str) -> List[str]:
    """The chunks of ``" ".join(text.split()).lower()`` for each text, each text's followed by ``boundary``.

    ``boundary`` must be a character none of the texts holds, that is not whitespace and lower-cases to
    itself (a control character).
    """
    separator = f" {boundary} "
    return (separator.join(texts) + separator).lower().split() if texts else []

