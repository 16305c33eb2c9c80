"""One validation step above the schema: the schema's own cross-setting rules, the methods' rules and
the privacy rules, combined; every problem of a configuration reported at once.

The layers, bottom up: :mod:`secfed.errors` (the error types) ← :mod:`secfed.config` (the schema) ←
the rules (:mod:`secfed.algorithms` for what a method supports, :mod:`secfed.privacy.policy` for
what a privacy setting needs) ← this module. Nothing below imports anything above it, so the schema
can be loaded, and a TOML file checked for types and ranges, without torch, Opacus or the methods.
Checks that need the data (how many clients there are) happen when the federation is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from secfed.algorithms import METHODS, Method, method_issues
from secfed.config import RunConfig, load_toml, schema_issues, with_overrides
from secfed.errors import raise_issues
from secfed.privacy.policy import static_issues


def check(cfg: RunConfig, *, saved: bool = False) -> None:
    """Every rule that spans settings; raises :class:`~secfed.errors.ConfigError` listing every violation.
    (An unknown method is one of them; the privacy rules then read the default method's declarations.)
    ``saved``: a run's own configuration (resumed, evaluated, audited): a setting it never reads stands."""
    method = METHODS.get(cfg.method.algorithm, Method)
    issues = [*method_issues(cfg), *schema_issues(cfg), *static_issues(cfg, method)]
    raise_issues(i for i in issues if not (saved and i.unused))


def run_config(*, toml: Path | None = None, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Defaults, then a TOML file, then overrides (typed text, as flags give them); checked as a whole."""
    cfg = load_toml(toml) if toml is not None else RunConfig()
    if overrides:
        cfg = with_overrides(cfg, overrides)
    check(cfg)
    return cfg


__all__ = ["check", "run_config"]
