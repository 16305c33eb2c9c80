"""Command-line options made from the configuration schema: one flag per setting, grouped in --help.

Every flag takes its value as text and hands it to :func:`secfed.config.with_overrides`, which
checks every flag of the invocation at once; click itself only parses. The help groups follow the
configuration's sections.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import rich_click as click

from secfed.config import KEYS, SECTIONS, ConfigError, Key

GROUP_TITLES = {"data": "Data", "model": "Model", "method": "Method", "schedule": "Schedule",
                "secagg": "Secure aggregation", "privacy": "Privacy", "run": "Run"}


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses nan and ±inf: click compares with ``<``, which nan passes."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class _Text(click.ParamType):
    """Passes the argument through as text, showing the setting's type in --help."""

    def __init__(self, metavar: str) -> None:
        self.name = metavar.lower()
        self._metavar = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:  # type: ignore[override]
        return self._metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value


def _metavar(key: Key) -> str:
    if choices := key.choices():
        return "[" + "|".join(str(c) for c in choices) + "]"
    if key.is_list:
        return "NAME,..."
    args = getattr(key.annotation, "__args__", (key.annotation,))
    kinds = {a for a in args if a is not type(None)}
    if kinds == {int}:
        return "INTEGER"
    if kinds == {float}:
        return "NUMBER"
    return "TEXT"


def _help(key: Key) -> str:
    default = key.default
    shown = "" if default in (None, [], ()) else f" [default: {str(default).lower() if key.is_flag else default}]"
    return f"{key.help}{shown}  ({key.dotted})"


def param_name(key: Key) -> str:
    return "cfg__" + key.dotted.replace(".", "__")


NEGATED = "cfgno__"  # the parameter of a choice's ``--no-…`` flag (``--no-pretrained``: none)


def key_of_param(name: str) -> str | None:
    for prefix in ("cfg__", NEGATED):
        if name.startswith(prefix):
            return name[len(prefix):].replace("__", ".")
    return None


def negative_flag(key: Key) -> str | None:
    """``--no-…`` of a boolean, or of a choice that is also a flag; None for other settings."""
    return "--no-" + key.flag[2:] if key.is_flag or key.flag_value else None


def config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``command`` with one option per configuration key (in reverse: click stacks them)."""
    for key in reversed(list(KEYS.values())):
        if key.is_flag:
            option = click.option(f"{key.flag}/{negative_flag(key)}", param_name(key), default=None, help=_help(key))
        elif key.flag_value:  # --pretrained [CHOICE] (alone: the flag value) and --no-pretrained (none)
            command = click.option(negative_flag(key), NEGATED + param_name(key)[len("cfg__"):], is_flag=True,
                                   default=None, help=f"Same as {key.flag} none.")(command)
            option = click.option(key.flag, param_name(key), type=_Text(_metavar(key)), is_flag=False,
                                  flag_value=key.flag_value, default=None, help=_help(key))
        else:
            option = click.option(key.flag, param_name(key), type=_Text(_metavar(key)), default=None,
                                  multiple=key.is_list, help=_help(key))
        command = option(command)
    return command


def option_panels(extra: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command with one --help panel per configuration section, then ``extra`` options."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        panels = [(GROUP_TITLES[section], [f for k in KEYS.values() if k.section == section
                                           for f in (k.flag, None if k.is_flag else negative_flag(k)) if f])
                  for section in SECTIONS]
        for title, flags in reversed([*panels, ("Command", extra)]):
            command = click.option_panel(title, options=flags)(command)
        return command

    return decorate


def given_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """{key: value as typed} for every configuration flag the user gave."""
    out = {}
    for name, value in params.items():
        key = key_of_param(name)
        if key is None or value is None or value == () or (name.startswith(NEGATED) and not value):
            continue
        out[key] = "none" if name.startswith(NEGATED) else list(value) if isinstance(value, tuple) else value
    return out


def render(error: ConfigError, *, typed: set[str] = frozenset(), from_file: set[str] = frozenset(),
           toml: str | None = None) -> str:
    """The error's problems with every key shown as the user can act on it: the flag they typed, the
    key of their TOML file, else the flag that would set it."""

    def name(key: str) -> str:
        if key == toml:  # the file itself (found by review: "/x.toml: /x.toml: no such file")
            return key
        if key in typed:
            return KEYS[key].flag
        if toml is not None and (key in from_file or key not in KEYS):
            return f"{toml}: {key}"
        return KEYS[key].flag if key in KEYS else key

    return error.render(name)
