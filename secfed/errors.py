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
    """``text`` (a path, a message) as it can be shown on a terminal: bytes that are not UTF-8 and
    control characters escaped (a file name could otherwise forge lines or colours: found by review)."""
    plain = str(os.fspath(text))
    try:  # a name read from disk keeps its undecodable bytes as surrogates: shown as \xNN
        raw = plain.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # other lone surrogates (typed, or from JSON)
        raw = plain.encode("utf-8", "backslashreplace").decode()
    return "".join(c if c.isprintable() or _shown_as_is(c) else repr(c)[1:-1] for c in raw)


# Spaces and the joiners people's names use (a no-break space, Persian's zero-width non-joiner) are
# shown as they are; controls, line breaks, bidirectional overrides and every other invisible format
# character (a zero-width space, tag characters: two names that look alike) are not (review).
_JOINERS = frozenset("\u200c\u200d")


def _shown_as_is(c: str) -> bool:
    return unicodedata.category(c) == "Zs" or c in _JOINERS


@dataclass(frozen=True)
class ConfigIssue:
    """One invalid setting: ``key`` (``schedule.rounds``) and what is wrong with it."""

    key: str
    message: str


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
