"""The raw-pixel nearest-neighbour baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from secfed.data.images import load_images
from secfed.data.market import load_market1501
from secfed.data.synth import generate
from secfed.evaluation.raw_pixels import raw_pixel_features, raw_pixel_scores


def test_known_answer() -> None:
    # A 1×1 image with channels (0, 0, 255): mean 85, deviations (-85, -85, 170) → unit vector.
    img = torch.tensor([0, 0, 255], dtype=torch.uint8).view(1, 3, 1, 1)
    expected = torch.tensor([-1.0, -1.0, 2.0]) / torch.tensor(6.0).sqrt()
    torch.testing.assert_close(raw_pixel_features(img)[0], expected)


def test_shape_norm_and_invariance_to_brightness_and_contrast() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(40, 160, (5, 3, 16, 8), dtype=torch.uint8, generator=g)
    feats = raw_pixel_features(images)
    assert feats.shape == (5, 3 * 16 * 8) and feats.dtype == torch.float32
    torch.testing.assert_close(feats.norm(dim=1), torch.ones(5))
    torch.testing.assert_close(feats.sum(dim=1), torch.zeros(5), atol=1e-4, rtol=0)  # mean removed
    brighter = (images.float() * 1.5 + 10).round().to(torch.uint8)  # still within 0..255
    cos = (raw_pixel_features(brighter) * feats).sum(dim=1)
    assert bool((cos > 0.999).all())
    other = (raw_pixel_features(images.roll(1, dims=0)) * feats).sum(dim=1)
    assert bool((other < 0.5).all())  # different images stay apart


def test_flat_image_maps_to_zero() -> None:
    flat = torch.full((2, 3, 4, 4), 77, dtype=torch.uint8)
    assert torch.count_nonzero(raw_pixel_features(flat)) == 0


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(2, 3, 4, 4),  # float, not uint8
        torch.zeros(3, 4, 4, dtype=torch.uint8),  # no batch dimension
        torch.zeros(2, 1, 4, 4, dtype=torch.uint8),  # grey, not RGB
        torch.zeros(0, 3, 4, 4, dtype=torch.uint8),  # empty
    ],
)
def test_bad_input_is_refused(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="images must be"):
        raw_pixel_features(bad)


def test_baseline_on_a_generated_domain(tmp_path: Path) -> None:
    """On synthetic data the baseline runs end to end and is better than chance but far from solved."""
    generate(tmp_path / "d", domains=1, seed=0, scale=0.5, height=64, width=32)
    ds = load_market1501(tmp_path / "d" / "campus")
    q, g = load_images(ds.query, 64, 32), load_images(ds.gallery, 64, 32)
    qp, gp = torch.tensor([s.pid for s in ds.query]), torch.tensor([s.pid for s in ds.gallery])
    qc, gc = torch.tensor([s.camid for s in ds.query]), torch.tensor([s.camid for s in ds.gallery])
    scores = raw_pixel_scores(q, g, qp, gp, qc, gc)
    # Rank-1 of a random ranking: per query, true matches over the gallery entries that count.
    same_id, same_cam = qp[:, None] == gp[None], qc[:, None] == gc[None]
    chance = ((same_id & ~same_cam).sum(1) / (~(same_id & same_cam)).sum(1)).mean().item()
    assert scores.num_valid_queries == len(ds.query)  # the generator guarantees a match for every query
    assert 0.0 <= scores.rank1 <= scores.rank5 <= scores.rank10 <= 1.0
    assert scores.rank1 > 1.5 * chance  # pixels carry some identity ...
    assert scores.rank1 < 0.5 and scores.mAP < 0.5  # ... but raw pixels must not solve synthetic ReID
