"""Differential privacy for secfed: clipping, noise (β, Gaussian, distributed Skellam), accounting, DP-SGD.

The front door is :func:`resolve`, which checks a run's privacy settings and returns a
:class:`PrivacyPlan` (what to clip, what noise to add where, what to divide by, what to print, and a
:class:`PrivacyLedger` that accounts ε round by round). The parts it composes are importable on
their own, each with one job.
"""

from secfed.privacy.accountant import SampledGaussianAccountant, noise_for_target_epsilon
from secfed.privacy.beta import BetaNoise, add_beta_noise
from secfed.privacy.clipping import clip_l2, l2_norm
from secfed.privacy.distributed import (
    RingTooSmall,
    SkellamParams,
    decode_sum,
    encode,
    rotation_seed,
    skellam_params,
    to_ring,
)
from secfed.privacy.dpsgd import PrivateTraining, dp_compatible, make_private, plain_name, poisson_schedule
from secfed.privacy.ledger import PrivacyLedger
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import DpSgdPlan, PrivacyPlan, resolve
from secfed.privacy.sampling import poisson_batches, poisson_subset
from secfed.privacy.skellam import SkellamAccountant

__all__ = [
    "BetaNoise",
    "NoiseSource",
    "DpSgdPlan",
    "PrivacyLedger",
    "PrivacyPlan",
    "PrivateTraining",
    "RingTooSmall",
    "SampledGaussianAccountant",
    "SkellamAccountant",
    "SkellamParams",
    "add_beta_noise",
    "clip_l2",
    "decode_sum",
    "dp_compatible",
    "encode",
    "l2_norm",
    "make_private",
    "noise_for_target_epsilon",
    "plain_name",
    "poisson_batches",
    "poisson_schedule",
    "poisson_subset",
    "resolve",
    "rotation_seed",
    "skellam_params",
    "to_ring",
]
