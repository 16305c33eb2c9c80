"""Calibration controls at toy sizes: what must never be called safe, and what must never be called a leak."""

from __future__ import annotations

import torch

from secfed.algorithms import base_method
from secfed.attacks.budget import Budget, Stopwatch
from secfed.attacks.controls import client_update, gallery_of, noise_images, photographs
from secfed.attacks.inversion import SimulatedClient
from secfed.attacks.judge import Judge
from secfed.attacks.targets import PROBE_FIT, attack_update
from secfed.attacks.verdict import Verdict, target_verdict
from secfed.config import RunConfig

TOY = Budget("toy", 3.0, inversion_iterations=8, restarts=1, max_dummies=8, feature_iterations=8,
             model_inversion_iterations=4, model_inversion_images=2, lower_bound=True)


def _untrained(cfg: RunConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return base_method(cfg).build_model(2)


def test_positive_control_one_step_on_two_people_is_never_called_safe(two_people, toy_config: RunConfig) -> None:
    """(a) one local step on two images of two identities, no secure aggregation: LEAK, or INCONCLUSIVE
    with residuals that say why — never NO-LEAK. The neck probe recovers the inputs (it fits)."""
    gallery, victims, images = two_people
    ctl = client_update(toy_config, _untrained(toy_config), images, torch.tensor([0, 1]), seed=4)
    results, _ = attack_update(model=ctl.model, layout=ctl.layout, start=ctl.start, observed=ctl.update,
                               clients=[SimulatedClient(ctl.steps)], judge=Judge(ctl.model, gallery), victims=victims,
                               budget=TOY, watch=Stopwatch(TOY.seconds))
    assert {r.attack for r in results} == {"probe:neck-bn(neck.0)", "inversion:gradient"}
    assert all(r.verdict is not Verdict.NO_LEAK for r in results)
    assert target_verdict(results)[0] in (Verdict.LEAK, Verdict.INCONCLUSIVE)
    probe = next(r for r in results if r.attack.startswith("probe:neck-bn"))
    assert probe.fitted and probe.residual < PROBE_FIT
    for r in results:
        if r.verdict is Verdict.INCONCLUSIVE:
            assert r.residual is not None and any(why in r.reason for why in (
                "did not fit", "part of the target", "do not reproduce", "no power"))
        assert r.iterations >= 0 and r.cpu_seconds >= 0 and r.assumptions["labels"].startswith("unknown")


def test_negative_control_untrained_model_on_noise_is_never_a_leak(toy_config: RunConfig) -> None:
    """An untrained model's step on two noise images: their 'identities' are other noise images, among
    four more noise 'people' (distractors of the same kind: noise looks like noise, not like anyone)."""
    noise = noise_images(24, 32, 16, seed=5)
    groups = [("noise/0", noise[:1]), ("noise/1", noise[4:5]), ("noise/0", noise[1:4]), ("noise/1", noise[5:8])]
    groups += [(f"noise/{k}", noise[4 * k: 4 * k + 4]) for k in range(2, 6)]
    gallery, where = gallery_of(groups, own=[True] * len(groups))
    ctl = client_update(toy_config, _untrained(toy_config), torch.cat([noise[:1], noise[4:5]]), torch.tensor([0, 1]),
                        seed=4)
    results, _ = attack_update(model=ctl.model, layout=ctl.layout, start=ctl.start, observed=ctl.update,
                               clients=[SimulatedClient(ctl.steps)], judge=Judge(ctl.model, gallery),
                               victims=where[0] + where[1], budget=TOY, watch=Stopwatch(TOY.seconds))
    assert results and all(r.verdict is not Verdict.LEAK for r in results)
    # the probe still recovered the noise images' features exactly: exact features of nobody identify nobody
    assert next(r for r in results if r.attack.startswith("probe:neck-bn")).fitted


def test_natural_photographs_of_people_with_no_other_picture_are_never_called_safe(toy_config: RunConfig) -> None:
    """The review's control: one client, one natural photograph (not drawn by the generator) of each of
    two people who have no other picture anywhere, one local step, no secure aggregation. Nothing says
    NO-LEAK: re-identification has no power here and every result says why; the probe still recovers
    both pictures' neck inputs exactly."""
    photos = photographs(32, 16, per_photo=2)
    groups = [(f"photo/{i}", photos[i:i + 1]) for i in range(len(photos))]
    gallery, where = gallery_of(groups, own=[True, True] + [False] * (len(photos) - 2))
    ctl = client_update(toy_config, _untrained(toy_config), photos[:2], torch.tensor([0, 1]), seed=4)
    results, _ = attack_update(model=ctl.model, layout=ctl.layout, start=ctl.start, observed=ctl.update,
                               clients=[SimulatedClient(ctl.steps)], judge=Judge(ctl.model, gallery),
                               victims=where[0] + where[1], budget=TOY, watch=Stopwatch(TOY.seconds))
    assert all(r.verdict is not Verdict.NO_LEAK for r in results)
    verdict, reason = target_verdict(results)
    assert verdict in (Verdict.LEAK, Verdict.INCONCLUSIVE) and reason
    probe = next(r for r in results if r.attack.startswith("probe:neck-bn"))
    assert probe.fitted and probe.metrics["weight_gradient_rank"] == 1
    inversion = next(r for r in results if r.attack == "inversion:gradient")
    reid = [t for name, t in inversion.tests.items() if name.startswith("reid")]
    assert reid and all(not t.measurable and "no power" in t.statistic for t in reid)
    assert "image-match" in inversion.tests  # the victims' own pictures are still compared with
