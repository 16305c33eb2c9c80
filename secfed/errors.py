"""The configuration's errors: one invalid setting (:class:`ConfigIssue`) and all of them (:class:`ConfigError`).

A module of its own, below everything else: the schema (:mod:`secfed.config`), the privacy rules
(:mod:`secfed.privacy.policy`), the methods and the CLI all raise these, and none of them needs to
import another to do so. :func:`printable` is here for the same reason: every error shows names
read from disk through it.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass


def printable(text: os.PathLike[str] | str) -> str:
    """``text`` (a path, a message) as it can be shown on a terminal: bytes that are not UTF-8, control
    and invisible characters escaped (a file name could otherwise forge lines or colours, or pass for
    another name: found by review). Spaces are shown, and the joiners people's names use (Persian's
    zero-width non-joiner) between letters."""
    plain = str(os.fspath(text))
    try:  # a name read from disk keeps its undecodable bytes as surrogates: shown as \xNN
        raw = plain.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # other lone surrogates (typed, or from JSON)
        raw = plain.encode("utf-8", "backslashreplace").decode()
    return "".join(c if _shown(raw, i) else _escaped(c) for i, c in enumerate(raw))


# Unicode's default-ignorable code points (DerivedCoreProperties.txt): drawn as nothing. Python's
# unicodedata has no such property, hence the table.
_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
              (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
              (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
              (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
_JOINERS = frozenset("\u200c\u200d")


def _escaped(c: str) -> str:
    """``c`` as Python writes it in a string literal, whatever Python thinks of showing it."""
    shown = repr(c)[1:-1]
    if shown != c:
        return shown
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"


# The scripts whose writing uses the joiners: Arabic, Syriac, N'Ko, the Indic scripts to Sinhala,
# Myanmar, Khmer, Mongolian, and Arabic's presentation forms.
_JOINING = ((0x0600, 0x08FF), (0x0900, 0x0DFF), (0x1000, 0x109F), (0x1780, 0x18AF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF))


def _joins(c: str) -> bool:
    return unicodedata.category(c)[0] in "LM" and any(lo <= ord(c) <= hi for lo, hi in _JOINING)


def _shown(text: str, i: int) -> bool:
    c = text[i]
    if c in _JOINERS:  # after a letter or sign of a script that joins (not in "ali‌ce", "да‌нные")
        return 0 < i and _joins(text[i - 1]) and (i == len(text) - 1 or _joins(text[i + 1]))
    if any(lo <= ord(c) <= hi for lo, hi in _IGNORABLE) or unicodedata.category(c) == "Cf" or c == "\u2800":
        return False
    return c.isprintable() or unicodedata.category(c) == "Zs"


@dataclass(frozen=True)
class ConfigIssue:
    """One invalid setting: ``key`` (``schedule.rounds``) and what is wrong with it. ``unused``: a value
    the configuration never reads (another method's setting, KD's without KD) — refused for a new run,
    let stand in a saved one, whose secfed accepted it (found by review: yesterday's runs could no
    longer be evaluated, audited or resumed)."""

    key: str
    message: str
    unused: bool = False


_KEY_REF = re.compile(r"`([a-z_]+\.[a-z_]+)`")


class ConfigError(ValueError):
    """One or more invalid settings. ``issues`` lists them all; ``key`` is the first one's key."""

    def __init__(self, key_or_issues: str | Iterable[ConfigIssue], message: str | None = None) -> None:
        if isinstance(key_or_issues, str):
            issues = [ConfigIssue(key_or_issues, message or "invalid")]
        else:
            issues = list(key_or_issues)
        if not issues:
            raise ValueError("a ConfigError needs at least one issue")
        self.issues = issues
        super().__init__(self.render())

    @property
    def key(self) -> str:
        return self.issues[0].key

    def render(self, name: Callable[[str], str] = lambda key: key) -> str:
        """All issues, one per line, with every key (the subject and `` `keys` `` in messages) shown
        as ``name(key)`` — a flag on the command line, a TOML key in a file."""
        lines = []
        for issue in self.issues:
            # one line each, shown as written: a name read from disk could carry escapes or newlines (review)
            message = printable(_KEY_REF.sub(lambda m: name(m.group(1)), issue.message))
            lines.append(f"{printable(name(issue.key))}: {message}")
        return "\n".join(lines)


def raise_issues(issues: Iterable[ConfigIssue]) -> None:
    """Raise one :class:`ConfigError` listing ``issues``, if there are any."""
    issues = list(issues)
    if issues:
        raise ConfigError(issues)


__all__ = ["ConfigError", "ConfigIssue", "raise_issues"]
