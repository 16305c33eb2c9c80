"""The verdict rule: a leak is a leak whatever the fit; "safe" only from an attack that fitted all of its target."""

from __future__ import annotations

import pytest

from secfed.attacks.verdict import ALPHA, AttackResult, LeakTest, Verdict, decide, no_test, target_verdict

SIGNIFICANT = LeakTest(True, 2, 2, 0.01, ALPHA / 10, "rank-1")
CHANCE = LeakTest(True, 0, 4, 0.05, 0.7, "rank-1")


def test_a_significant_identification_is_a_leak_even_without_a_fit() -> None:
    verdict, reason = decide({"reid-pixels": SIGNIFICANT}, residual=0.9, fit_threshold=0.05, complete=True)
    assert verdict is Verdict.LEAK and "reid-pixels" in reason


def test_a_leak_by_ranks_says_its_p_comes_from_the_ranks_not_the_rank_1_count() -> None:
    # The default run's audit said "p = 0.0014 < 0.01 (1/6 at rank 1, chance 0.17)": a rank-1 count at
    # chance beside a significant p reads as a contradiction unless the reason says where p comes from.
    at_chance = LeakTest(True, 1, 6, 1 / 6, 0.0014, "rank-1")
    verdict, reason = decide({"reid-pixels": at_chance}, residual=0.1, fit_threshold=0.25, complete=True)
    assert verdict is Verdict.LEAK
    assert "rank higher than chance" in reason and "1/6 at rank 1" in reason


@pytest.mark.parametrize("residual", [None, 0.06, 1.0])
def test_an_attack_that_did_not_fit_never_says_no_leak(residual: float | None) -> None:
    verdict, reason = decide({"reid-embedding": CHANCE}, residual=residual, fit_threshold=0.05, complete=True)
    assert verdict is Verdict.INCONCLUSIVE and "did not fit" in reason


def test_a_fitted_complete_attack_that_finds_nothing_says_no_leak_at_this_strength() -> None:
    verdict, _ = decide({"reid-embedding": CHANCE}, residual=0.01, fit_threshold=0.05, complete=True)
    assert verdict is Verdict.NO_LEAK


def test_a_fitted_probe_of_part_of_the_target_proves_nothing() -> None:
    verdict, reason = decide({"reid-embedding": CHANCE}, residual=1e-6, fit_threshold=1e-3, complete=False)
    assert verdict is Verdict.INCONCLUSIVE and "part of the target" in reason


def test_a_fitted_probe_without_power_says_no_power_not_part_of_the_target() -> None:
    verdict, reason = decide({"reid-embedding": no_test("no power: no other picture")}, residual=1e-6,
                             fit_threshold=1e-3, complete=False)
    assert verdict is Verdict.INCONCLUSIVE and "no power" in reason and "part of the target" not in reason


def test_a_time_limit_under_the_budget_s_own_makes_the_audit_a_lower_bound() -> None:
    """(review 82: `--budget standard --time-limit 30` ran fewer iterations than quick and was not labelled)"""
    from secfed.attacks.budget import BUDGETS

    assert BUDGETS["standard"].with_seconds(30).lower_bound and BUDGETS["quick"].with_seconds(600).lower_bound
    assert not BUDGETS["standard"].with_seconds(300).lower_bound and not BUDGETS["thorough"].lower_bound


def test_a_fit_without_a_measurable_test_is_inconclusive() -> None:
    verdict, _ = decide({"reid-embedding": no_test("no other picture")}, residual=0.0, fit_threshold=0.05,
                        complete=True)
    assert verdict is Verdict.INCONCLUSIVE


def test_a_membership_leak_says_what_it_measured_not_a_re_identification() -> None:
    members = LeakTest(True, 2, 2, 0.01, 0.0002, "member identities above the non-members' 99th percentile")
    verdict, reason = decide({"membership": members}, residual=None, fit_threshold=None, complete=False)
    assert verdict is Verdict.LEAK and "99th percentile" in reason and "other pictures" not in reason


def test_a_p_value_at_the_level_is_not_significant() -> None:
    assert not LeakTest(True, 1, 1, 0.5, ALPHA, "").significant
    assert not LeakTest(False, 3, 3, 0.0, 0.0, "").significant  # nothing measured, nothing claimed


def _result(verdict: Verdict, residual: float | None = 0.5) -> AttackResult:
    return AttackResult("a", "update", verdict, str(verdict), residual, "r", 0.1, True)


def test_target_verdict_takes_the_worst_news_first() -> None:
    assert target_verdict([_result(Verdict.NO_LEAK), _result(Verdict.LEAK)])[0] is Verdict.LEAK
    assert target_verdict([_result(Verdict.INCONCLUSIVE), _result(Verdict.NO_LEAK)])[0] is Verdict.NO_LEAK
    verdict, reason = target_verdict([_result(Verdict.INCONCLUSIVE, 0.3), _result(Verdict.INCONCLUSIVE, 0.9)])
    assert verdict is Verdict.INCONCLUSIVE and "0.3" in reason
    assert target_verdict([])[0] is Verdict.INCONCLUSIVE


def test_a_gradient_fit_whose_pictures_do_not_explain_the_update_proves_nothing() -> None:
    """The review's case: 1 − cos = 0.011 under the fit threshold, but the reconstructions are not the
    pictures behind the update (their batch statistics do not match): INCONCLUSIVE, not NO-LEAK."""
    verdict, reason = decide({"reid-embedding": CHANCE}, residual=0.011, fit_threshold=0.05, complete=True,
                             reconstruction=(0.8, 0.05))
    assert verdict is Verdict.INCONCLUSIVE and "do not reproduce" in reason
    verdict, reason = decide({"reid-embedding": CHANCE}, residual=0.011, fit_threshold=0.05, complete=True,
                             reconstruction=(None, 0.05))
    assert verdict is Verdict.INCONCLUSIVE and "gradient fit alone" in reason
    assert decide({"reid-embedding": CHANCE}, residual=0.011, fit_threshold=0.05, complete=True,
                  reconstruction=(0.01, 0.05))[0] is Verdict.NO_LEAK
    # a NaN reconstruction residual passed `value > limit` and fell through to NO-LEAK
    assert decide({"reid-embedding": CHANCE}, residual=0.011, fit_threshold=0.05, complete=True,
                  reconstruction=(float("nan"), 0.05))[0] is Verdict.INCONCLUSIVE
    result = AttackResult("inversion:gradient", "update", Verdict.INCONCLUSIVE, "", 0.011, "r", 0.05, True,
                          reconstruction_residual=0.8, reconstruction_threshold=0.05)
    assert not result.fitted


def test_without_power_the_verdict_says_why_and_an_image_match_is_a_leak_of_its_own() -> None:
    """No other picture of a victim: re-identification cannot be tested, so no NO-LEAK — even with an
    image-level test that found nothing; an image-level match is a LEAK without any p-value."""
    no_power = no_test("no power: the gallery holds no other picture of the victims")
    clean = LeakTest(True, 0, 2, 0.0, 1.0, "ssim", threshold=True)
    verdict, reason = decide({"image-match": clean, "reid-pixels": no_power}, residual=0.0, fit_threshold=0.05,
                             complete=True)
    assert verdict is Verdict.INCONCLUSIVE and "no power" in reason
    match = LeakTest(True, 1, 2, 0.0, 0.0, "ssim", threshold=True)
    verdict, reason = decide({"image-match": match, "reid-pixels": no_power}, residual=0.9, fit_threshold=0.05,
                             complete=True)
    assert verdict is Verdict.LEAK and "victim's own picture" in reason
    assert match.to_dict()["p_value"] is None and match.to_dict()["rule"] == "threshold"


def test_an_attack_result_takes_its_effort_by_name_only() -> None:
    """(found by review: three attacks gave iterations and restarts in order, which landed in the
    reconstruction residual's fields — audit.json said "fitted": false of fitted attacks and "0 × 0")"""
    import pytest

    from secfed.attacks.verdict import AttackResult, Verdict

    head = ("inversion:model", "weights", Verdict.NO_LEAK, "fitted", 0.05, "residual", 0.1, True)
    with pytest.raises(TypeError):
        AttackResult(*head, 120, 1)
    result = AttackResult(*head, iterations=120, restarts=1)
    assert result.fitted and (result.iterations, result.restarts) == (120, 1)
