"""Feature extraction: flip-sum, normalisation, eval mode and its restoration; evaluate_model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from secfed.evaluation.features import evaluate_model, extract_features
from secfed.models.reid import ReIDModel

@pytest.fixture(autouse=True)
def single_thread():
    # Tiny batches gain nothing from threads, and on a busy 2-core machine OpenMP's spinning
    # threads make a 5-image ResNet-18 forward pass take a second instead of 20 ms.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


class LinearReID(nn.Module):
    """embed = a fixed linear map of the pixels, then dropout (which must be off during extraction)."""

    def __init__(self, height: int, width: int, dim: int = 5) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * height * width, dim, bias=False)
        self.dropout = nn.Dropout(0.5)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(x.flatten(1)))


class MeanColour(nn.Module):
    """embed = the mean normalised colour: images of one colour share a feature."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x.mean(dim=(2, 3))


def test_flip_sum_then_l2_normalised() -> None:
    torch.manual_seed(0)
    model = LinearReID(4, 6)
    images = torch.randint(0, 256, (7, 3, 4, 6), dtype=torch.uint8)

    features = extract_features(model, images, batch_size=3)

    x = (images.float() / 255 - MEAN) / STD
    summed = model.proj(x.flatten(1)) + model.proj(x.flip(3).flatten(1))
    expected = summed / summed.norm(dim=1, keepdim=True)
    torch.testing.assert_close(features, expected.detach(), rtol=1e-5, atol=1e-6)
    unflipped = model.proj(x.flatten(1))
    assert not torch.allclose(expected, unflipped / unflipped.norm(dim=1, keepdim=True), atol=1e-3)
    assert features.dtype == torch.float32 and features.shape == (7, 5)


def test_training_modes_are_restored_per_module() -> None:
    model = ReIDModel("resnet18", num_classes=3)
    model.train()
    model.neck[1].eval()  # a caller freezing the neck's BatchNorm on purpose
    images = torch.randint(0, 256, (5, 3, 32, 16), dtype=torch.uint8)

    first = extract_features(model, images, batch_size=2)
    assert model.training and model.backbone.training and model.neck[2].training
    assert not model.neck[1].training
    # Dropout and batch statistics were off: same features again, whatever the batch size.
    torch.testing.assert_close(extract_features(model, images, batch_size=5), first, rtol=1e-5, atol=1e-5)


def test_resnet_features_are_unit_length_and_mirror_invariant() -> None:
    torch.manual_seed(1)
    model = ReIDModel("resnet18", num_classes=3).eval()
    images = torch.randint(0, 256, (4, 3, 32, 16), dtype=torch.uint8)
    features = extract_features(model, images)
    assert features.shape == (4, model.feature_dim)
    torch.testing.assert_close(features.norm(dim=1), torch.ones(4))
    torch.testing.assert_close(extract_features(model, images.flip(3)), features, rtol=1e-5, atol=1e-5)
    assert not model.training


@pytest.mark.parametrize(
    ("images", "batch_size", "message"),
    [
        (torch.zeros(2, 3, 4, 4), 8, "images must be a uint8 torch.Tensor"),
        (torch.zeros(2, 1, 4, 4, dtype=torch.uint8), 8, "N × 3 × H × W"),
        (torch.zeros(0, 3, 4, 4, dtype=torch.uint8), 8, "non-empty"),
        (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), 0, "batch_size must be a positive integer"),
    ],
)
def test_bad_images_are_refused(images: torch.Tensor, batch_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        extract_features(MeanColour(), images, batch_size)


def solid(colours: list[tuple[int, int, int]]) -> torch.Tensor:
    return torch.tensor(colours, dtype=torch.uint8).view(-1, 3, 1, 1).expand(-1, 3, 8, 4).contiguous()


def test_evaluate_model_end_to_end() -> None:
    # Person 1 wears red, person 2 green. The gallery also holds a junk image of person 1 from the
    # query's own camera (identical colour, so it would rank first if it were not removed).
    query = solid([(200, 10, 10), (10, 200, 10)])
    gallery = solid([(200, 10, 10), (190, 20, 20), (20, 190, 20), (10, 10, 200)])
    scores = evaluate_model(
        MeanColour(),
        query,
        gallery,
        query_pids=torch.tensor([1, 2]),
        query_camids=torch.tensor([0, 0]),
        gallery_pids=torch.tensor([1, 1, 2, 0]),
        gallery_camids=torch.tensor([0, 1, 1, 1]),
    )
    assert scores.rank1 == 1.0 and scores.mAP == 1.0
    assert scores.num_valid_queries == 2


def test_evaluate_model_checks_labels_before_extracting() -> None:
    class Exploding(MeanColour):
        def embed(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("features were extracted before the labels were checked")

    images = solid([(1, 2, 3)] * 3)
    with pytest.raises(ValueError, match="gallery_camids has 2 entries for 3 images"):
        evaluate_model(Exploding(), images, images, [1, 2, 3], [0, 0, 0], [1, 2, 3], [1, 1])
    with pytest.raises(ValueError, match="gallery_images must be a uint8 torch.Tensor"):
        evaluate_model(Exploding(), images, images.float(), [1, 2, 3], [0, 0, 0], [1, 2, 3], [1, 1, 1])
