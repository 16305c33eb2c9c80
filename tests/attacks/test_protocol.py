"""Protocol checks read from a run's configuration, log and recorded model hashes."""

from __future__ import annotations

from typing import Any

from secfed.attacks.protocol import protocol_checks, protocol_verdict
from secfed.attacks.verdict import Verdict
from secfed.config import RunConfig


def _config(secagg: bool = True, authenticated: bool = True, beta: float = 0.0,
            clip: float | None = None) -> dict[str, Any]:
    cfg = RunConfig()
    cfg.secagg.enabled = secagg
    cfg.secagg.authenticated = authenticated
    cfg.privacy.dp_beta = beta
    cfg.privacy.clip = clip
    return cfg.to_dict()


def _round(t: int, cohort: list[str], dropped: dict[str, str] | None = None, contributors: int | None = None) -> dict:
    dropped = dropped or {}
    kept = [c for c in cohort if c not in dropped]
    return {"round": t, "cohort": cohort, "dropped": dropped, "contributors": len(kept) if contributors is None else contributors,
            "clients": {c: {"loss": 1.0} for c in kept}}


def _status(findings, check: str) -> str:
    return next(f.status for f in findings if f.check == check)


def test_a_default_like_run_passes_with_its_logs_named_as_a_risk() -> None:
    history = [_round(t, ["a", "b", "c", "d"]) for t in (1, 2, 3)]
    findings = protocol_checks(_config(), history, {})
    assert {f.check: f.status for f in findings} == {
        "secure-aggregation": "pass", "same-model": "pass", "min-cohort": "pass", "dropout-differencing": "pass",
        "participation-metadata": "risk"}
    verdict, reason = protocol_verdict(findings)
    assert verdict is Verdict.NO_LEAK and "participation-metadata" in reason


def test_two_client_aggregates_expose_each_to_the_other() -> None:
    history = [_round(1, ["a", "b", "c"]), _round(2, ["a", "b", "c"], {"c": "advertise_keys"})]
    findings = protocol_checks(_config(), history, {})
    assert _status(findings, "min-cohort") == "fail"
    assert protocol_verdict(findings)[0] is Verdict.LEAK
    claimed = [{**r, "privacy": {"epsilon": 3.2, "delta": 1e-5}} for r in history]
    assert _status(protocol_checks(_config(beta=1e-3, clip=1.0), claimed, {}), "min-cohort") == "risk"
    # Noise that no claimed ε covers softens nothing, whatever its size: β without a clip, and clipped
    # β 1e-9 outside an ε (found by review: it turned this LEAK into NO-LEAK), still expose each to the other
    for settings in (dict(beta=5e-4), dict(beta=1e-9), dict(beta=1e-9, clip=1.0), dict(beta=1e-3, clip=1.0)):
        unbounded = protocol_checks(_config(**settings), history, {})
        assert _status(unbounded, "min-cohort") == "fail" and protocol_verdict(unbounded)[0] is Verdict.LEAK


def test_aggregates_that_differ_by_one_client_are_named() -> None:
    history = [_round(1, ["a", "b", "c", "d"]), _round(2, ["a", "b", "c", "d"], {"d": "share_keys"}),
               _round(3, ["a", "b", "c", "d"], {"a": "unmask"})]  # a vanished after masking: still in the sum
    findings = protocol_checks(_config(), history, {})
    diff = next(f for f in findings if f.check == "dropout-differencing")
    assert diff.status == "risk" and "rounds 1/2 (d)" in diff.detail and "rounds 2/3 (d)" in diff.detail
    assert "1/3" not in diff.detail


def test_recorded_hashes_that_differ_are_a_failed_same_model_check() -> None:
    history = [_round(1, ["a", "b", "c"])]
    same = protocol_checks(_config(), history, {1: {0: b"x" * 32, 1: b"x" * 32, 2: b"x" * 32}})
    assert _status(same, "same-model") == "pass"
    split = protocol_checks(_config(), history, {1: {0: b"x" * 32, 1: b"y" * 32, 2: b"x" * 32}})
    assert _status(split, "same-model") == "fail"
    unauthenticated = protocol_checks(_config(authenticated=False), history, {1: {0: None, 1: None, 2: None}})
    assert _status(unauthenticated, "same-model") == "not-checked"
    assert protocol_verdict(unauthenticated)[0] is Verdict.INCONCLUSIVE


def test_a_plain_channel_and_a_private_log_are_reported_as_such() -> None:
    dp_log = [{"round": t, "contributors": 4, "outside_epsilon": ["contributors"]} for t in (1, 2)]
    findings = protocol_checks(_config(secagg=False), dp_log, {})
    assert _status(findings, "secure-aggregation") == "risk"
    assert _status(findings, "dropout-differencing") == "not-checked"
    assert _status(findings, "participation-metadata") == "pass"


def test_turning_on_client_level_dp_never_makes_the_protocol_verdict_worse() -> None:
    """A DP run logs no cohorts: dropout-differencing is not applicable there (its ε covers
    participation), not unchecked — so `--fail-on inconclusive` does not fail the more private run."""
    plain = protocol_checks(_config(), [_round(t, ["a", "b", "c", "d"]) for t in (1, 2)], {})
    cfg = RunConfig()
    cfg.privacy.noise_multiplier = 1.0
    dp_log = [{"round": t, "contributors": 4, "outside_epsilon": ["contributors"]} for t in (1, 2)]
    private = protocol_checks(cfg.to_dict(), dp_log, {})
    assert _status(private, "dropout-differencing") == "not-applicable"
    assert protocol_verdict(plain)[0] is Verdict.NO_LEAK
    verdict, reason = protocol_verdict(private)
    assert verdict is Verdict.NO_LEAK and "not applicable: dropout-differencing" in reason
