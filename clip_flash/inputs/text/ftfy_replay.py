"""OpenCLIP's ``basic_clean`` (``ftfy.fix_text``, then ``html.unescape`` twice) replayed with ftfy's own
functions, skipping every step proven to return its input unchanged: the same text, several times faster.

``ftfy.fix_text`` (ftfy 6.3, default ``TextFixerConfig``) cuts the text into segments after each
``\\n`` (and every ``max_decode_length`` characters; longer texts are not replayed), turns HTML unescaping
off from the first segment holding ``<`` on, and runs ``fix_and_explain`` on each segment: a loop that
applies, in order, ``unescape_html``, ``fix_encoding``, ``fix_c1_controls``, ``fix_latin_ligatures``,
``fix_character_width``, ``uncurl_quotes``, ``fix_line_breaks``, ``fix_surrogates``,
``remove_terminal_escapes``, ``remove_control_chars`` and NFC, until a round changes nothing.
``replay_basic_clean`` runs that same control flow and calls ftfy's own function for each step, except
where the step is the identity:

- ``unescape_html`` only rewrites matches of a pattern that starts with ``&``: skipped without ``&``.
- ``fix_encoding`` returns a segment unchanged when it is ASCII or ``is_bad(segment)`` is False (its own
  first test). ``is_bad`` is one search of ftfy's ``BADNESS_RE``, slow on long text; each alternative of
  that pattern needs a character from an explicit set of non-ASCII characters (read from the parsed
  pattern: ``badness_triggers``) and a match is at most ``width`` characters long (7 in ftfy 6.3). The
  pattern has no lookaround and only ``^`` as an anchor, so a match exists iff a search of the window of
  ``width`` characters either side of some trigger character finds one (``pattern.search(text, pos,
  endpos)`` keeps ``^`` at the real start, as ``is_bad`` sees it): ``is_bad_in_windows``.
- the eight character fixers touch only their own characters (the translate tables ``LIGATURES``,
  ``WIDTH_MAP``, ``CONTROL_CHARS``; the C1, curly-quote and surrogate classes; ``\\r``, U+2028, U+2029,
  U+0085 for line breaks; ESC for terminal escapes: ``fixer_triggers``, read from ftfy at first use). Each
  runs, in ftfy's order, only on a text holding some of its characters (checked on its own input, since an
  earlier fixer may add them: C1 controls become curly quotes).
- NFC: skipped when ``unicodedata.is_normalized('NFC', text)``.

``html.unescape`` is then called as OpenCLIP calls it (it returns a text without ``&`` at once). The
control flow is ftfy 6.3's: ``replay_refusal`` refuses any other ftfy version or default configuration,
and the tokenizer then cleans with OpenCLIP's own function. ``tests/inputs/test_ftfy_replay.py`` compares
the replay with ``ftfy.fix_text`` and OpenCLIP's ``clean_fn`` on large targeted corpora.
"""
from __future__ import annotations

import functools
import html
import re
import unicodedata
from typing import Dict, FrozenSet, Optional, Pattern, Tuple

# Characters fix_line_breaks rewrites (ftfy's fixes.fix_line_breaks).
LINE_BREAK_CHARACTERS = "\r\u2028\u2029\x85"
# A badness pattern whose matches could be longer than this is searched whole instead of in windows.
_MAX_WINDOW_WIDTH = 32


@functools.lru_cache(maxsize=None)
def fixer_triggers() -> Dict[str, FrozenSet[str]]:
    """Per character fixer of ``fix_and_explain`` (by ftfy's name), the characters it may change or remove,
    read from ftfy's own tables and regexes: the fixer returns any text without them unchanged."""
    from ftfy import chardata, fixes

    def characters(*patterns: Pattern) -> FrozenSet[str]:
        return frozenset(chr(point) for pattern in patterns for point in _class_characters(pattern))
    return {
        "fix_c1_controls": characters(chardata.C1_CONTROL_RE),
        "fix_latin_ligatures": frozenset(map(chr, chardata.LIGATURES)),
        "fix_character_width": frozenset(map(chr, chardata.WIDTH_MAP)),
        "uncurl_quotes": characters(chardata.SINGLE_QUOTE_RE, chardata.DOUBLE_QUOTE_RE),
        "fix_line_breaks": frozenset(LINE_BREAK_CHARACTERS),
        "fix_surrogates": characters(fixes.SURROGATE_RE),
        "remove_terminal_escapes": frozenset("\x1b"),  # every escape sequence starts with ESC
        "remove_control_chars": frozenset(map(chr, chardata.CONTROL_CHARS)),
    }


def fixer_trigger_characters() -> FrozenSet[str]:
    """Every character one of the eight character fixers may change or remove."""
    return frozenset().union(*fixer_triggers().values())


def _class_characters(pattern: Pattern) -> FrozenSet[int]:
    """The code points a one-character-class regex matches (by parsing it; by testing every code point
    if it is not that simple)."""
    parser = _regex_parser()
    parsed = parser.parse(pattern.pattern, pattern.flags)
    if len(parsed.data) == 1 and not pattern.flags & re.IGNORECASE:
        points = _explicit_characters(parsed.data[0], parser)
        if points is not None:
            return points
    return frozenset(ord(char) for char in pattern.findall("".join(map(chr, range(0x110000)))))


def _regex_parser():
    try:
        import re._parser as parser  # Python 3.11+
    except ImportError:  # pragma: no cover - older Pythons
        import sre_parse as parser  # type: ignore[no-redef]
    return parser


def _explicit_characters(item: Tuple, parser) -> Optional[FrozenSet[int]]:
    """The code points one parsed regex element matches, if it is a literal or a plain class."""
    op, value = item
    if op is parser.LITERAL:
        return frozenset([value])
    if op is parser.IN:
        points = set()
        for member_op, member in value:
            if member_op is parser.LITERAL:
                points.add(member)
            elif member_op is parser.RANGE:
                points.update(range(member[0], member[1] + 1))
            else:  # NEGATE, CATEGORY (\w, \s ...): not a finite explicit set
                return None
        return frozenset(points)
    return None


@functools.lru_cache(maxsize=None)
def badness_triggers() -> Optional[Tuple[str, int]]:
    """(a regex character class of the trigger characters, the longest match's width) for ftfy's
    ``BADNESS_RE``, or None when its shape does not allow the windowed search (then ``is_bad`` runs on
    the whole text)."""
    from ftfy.badness import BADNESS_RE
    parser = _regex_parser()

    if BADNESS_RE.flags & (re.IGNORECASE | re.MULTILINE):
        return None
    parsed = parser.parse(BADNESS_RE.pattern, BADNESS_RE.flags)
    width = parsed.getwidth()[1]
    if width > _MAX_WINDOW_WIDTH:
        return None
    alternatives = parsed.data[0][1][1] if len(parsed.data) == 1 and parsed.data[0][0] is parser.BRANCH \
        else [parsed]
    triggers = set()
    for alternative in alternatives:
        # Top-level elements of an alternative are all required; pick one whose characters are all
        # non-ASCII (the smallest such set), so that ASCII never triggers the search.
        candidates = [points for points in (_explicit_characters(item, parser) for item in alternative.data)
                      if points and min(points) >= 0x80]
        if not candidates:
            return None
        triggers |= min(candidates, key=len)
    return "[" + "".join(re.escape(chr(point)) for point in sorted(triggers)) + "]", width


# The default configuration the replayed control flow assumes (ftfy 6.3's TextFixerConfig defaults).
_DEFAULT_CONFIG = {"unescape_html": "auto", "remove_terminal_escapes": True, "fix_encoding": True,
                   "restore_byte_a0": True, "replace_lossy_sequences": True, "decode_inconsistent_utf8": True,
                   "fix_c1_controls": True, "fix_latin_ligatures": True, "fix_character_width": True,
                   "uncurl_quotes": True, "fix_line_breaks": True, "fix_surrogates": True,
                   "remove_control_chars": True, "normalization": "NFC", "max_decode_length": 1000000}
# fix_and_explain's fixers after fix_encoding, in its order.
_CHARACTER_FIXERS = ("fix_c1_controls", "fix_latin_ligatures", "fix_character_width", "uncurl_quotes",
                     "fix_line_breaks", "fix_surrogates", "remove_terminal_escapes", "remove_control_chars")


@functools.lru_cache(maxsize=None)
def replay_refusal() -> Optional[str]:
    """Why ftfy's cleaning cannot be replayed here (another ftfy version or default), or None."""
    try:
        import ftfy
    except ImportError:
        return "ftfy is not installed"
    if not ftfy.__version__.startswith("6.3."):
        return f"ftfy {ftfy.__version__} is not the audited 6.3"
    defaults = ftfy.TextFixerConfig()._asdict()
    defaults.pop("explain", None)
    if defaults != _DEFAULT_CONFIG:
        return f"ftfy's default configuration {defaults} is not the audited one"
    missing = [name for name in ("unescape_html",) + _CHARACTER_FIXERS if name not in ftfy.FIXERS]
    if missing:
        return f"ftfy has no fixers {missing}"
    return None


class _Replay:
    """ftfy's functions and the compiled trigger patterns, looked up once."""

    def __init__(self) -> None:
        import ftfy
        from ftfy.badness import BADNESS_RE, is_bad
        from ftfy.fixes import unescape_html
        self.fix_encoding, self.is_bad, self.badness, self.unescape_html = ftfy.fix_encoding, is_bad, BADNESS_RE, \
            unescape_html
        self.max_length = ftfy.TextFixerConfig().max_decode_length
        self.fixer_pattern = _character_class(fixer_trigger_characters())
        # (fixer, the characters it may touch), in fix_and_explain's order.
        self.fixers = [(ftfy.FIXERS[name], _character_class(fixer_triggers()[name])) for name in _CHARACTER_FIXERS]
        triggers = badness_triggers()
        self.trigger_pattern = re.compile(triggers[0]) if triggers else None
        self.width = triggers[1] if triggers else 0


def _character_class(characters: FrozenSet[str]) -> Pattern:
    return re.compile("[" + "".join(map(re.escape, sorted(characters))) + "]")


@functools.lru_cache(maxsize=None)
def _replay() -> _Replay:
    return _Replay()


def is_bad_in_windows(text: str) -> bool:
    """``ftfy.badness.is_bad(text)``, searched only around the characters a match needs (see the docstring)."""
    replay = _replay()
    if replay.trigger_pattern is None:
        return replay.is_bad(text)
    window_start, window_end = 0, -1
    for match in replay.trigger_pattern.finditer(text):
        start, end = max(0, match.start() - replay.width + 1), match.start() + replay.width
        if start > window_end:  # a new window: search the previous one
            if window_end >= 0 and replay.badness.search(text, window_start, window_end) is not None:
                return True
            window_start = start
        window_end = end
    return window_end >= 0 and replay.badness.search(text, window_start, window_end) is not None


def _fix_segment(text: str, unescape: bool, replay: _Replay) -> str:
    """``ftfy.fix_and_explain(text, config).text`` for the default config (``unescape`` from "auto")."""
    while True:
        original = text
        if unescape and "&" in text:
            text = replay.unescape_html(text)
        if not text.isascii() and is_bad_in_windows(text):
            text = replay.fix_encoding(text)
        if replay.fixer_pattern.search(text) is not None:
            for fixer, touched in replay.fixers:  # each one only where its input holds what it touches
                if touched.search(text) is not None:
                    text = fixer(text)
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        if text == original:
            return text


def replay_fix_text(text: str) -> Optional[str]:
    """``ftfy.fix_text(text)``, or None for a text longer than ftfy's ``max_decode_length``."""
    replay = _replay()
    if len(text) > replay.max_length:
        return None
    if "\n" not in text:
        return _fix_segment(text, "<" not in text, replay) if text else text
    fixed, unescape = [], True
    pieces = text.split("\n")
    for index, piece in enumerate(pieces):
        segment = piece + "\n" if index < len(pieces) - 1 else piece
        if not segment:
            continue
        unescape = unescape and "<" not in segment
        fixed.append(_fix_segment(segment, unescape, replay))
    return "".join(fixed)


def replay_basic_clean(text: str) -> Optional[str]:
    """OpenCLIP's ``basic_clean(text)`` before its ``strip`` (``html.unescape(html.unescape(fix_text(text)))``),
    or None where not replayed. OpenCLIP's ``clean_fn(text)`` is then ``" ".join(result.split()).lower()``."""
    fixed = replay_fix_text(text)
    return None if fixed is None else html.unescape(html.unescape(fixed))
