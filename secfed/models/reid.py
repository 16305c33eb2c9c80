"""The IDE ReID model of FedReIDBench: a torchvision ResNet backbone, a neck, a per-client classifier.

    image ─► backbone (ResNet conv stages + global average pool) ─► neck (Linear→512, BN, Dropout 0.5)
          ─► classifier (Linear 512→#ids, private to each client)

The neck output is the ReID feature used for retrieval. Which of these tensors travel to the server
is decided in one place only: :mod:`secfed.models.sharing`.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Union

import torch
import torchvision
from torch import nn

from secfed.models.recipe import BACKBONES

Backbone = Literal["resnet18", "resnet34", "resnet50"]
_WEIGHTS = {
    "resnet18": torchvision.models.ResNet18_Weights.IMAGENET1K_V1,
    "resnet34": torchvision.models.ResNet34_Weights.IMAGENET1K_V1,
    "resnet50": torchvision.models.ResNet50_Weights.IMAGENET1K_V1,
}


# False: from scratch; True: ImageNet (torchvision's cached file); a mapping: these backbone tensors
# (the synthetic pretraining's, :mod:`secfed.models.pretrain`), loaded strictly, names unchanged.
Pretrained = Union[bool, Mapping[str, torch.Tensor]]


class PretrainedWeightsUnavailable(RuntimeError):
    """Pretrained weights were asked for but could not be had (no cached file and no download)."""


def imagenet_state_dict(name: str) -> dict[str, torch.Tensor]:
    """torchvision's ImageNet weights from its cache, checked against the SHA-256 prefix their file name
    carries (as torchvision's ``check_hash``). Never downloaded: the help promises it, and a site may
    have no network (found by review: torchvision's loader fetched a missing file)."""
    weights = _WEIGHTS[name]
    filename = weights.url.rsplit("/", 1)[-1]
    cached = Path(torch.hub.get_dir()) / "checkpoints" / filename
    advice = f"Put {filename} into {cached.parent}/ (from {weights.url}), or train without --pretrained."
    try:
        data = cached.read_bytes()
    except OSError as exc:
        raise PretrainedWeightsUnavailable(f"ImageNet weights for {name} are not cached ({cached}: "
                                           f"{exc.strerror}); secfed downloads nothing. {advice}") from None
    prefix = re.search(r"-([0-9a-f]{8,})\.", filename)
    if prefix and not hashlib.sha256(data).hexdigest().startswith(prefix.group(1)):
        raise PretrainedWeightsUnavailable(f"{cached}: its SHA-256 does not begin with {prefix.group(1)}, as its "
                                           f"name says: a damaged or other file. {advice}")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # not a state dict torch can read without running code
        raise PretrainedWeightsUnavailable(f"{cached}: not readable as weights ({str(exc).splitlines()[0]}). "
                                           f"{advice}") from None


class Neck(nn.Sequential):
    """FedReIDBench's bottleneck: Linear(in, 512) + BatchNorm1d + Dropout(0.5). Its output is the feature."""

    def __init__(self, in_features: int, dim: int = 512, dropout: float = 0.5) -> None:
        super().__init__(*linear_bn(in_features, dim), nn.Dropout(dropout))


def linear_bn(in_features: int, dim: int) -> tuple[nn.Linear, nn.BatchNorm1d]:
    """Linear + BatchNorm1d with both reference codes' initialisation (Kaiming fan-out; BN γ ~ N(1, 0.02))."""
    linear = nn.Linear(in_features, dim)
    nn.init.kaiming_normal_(linear.weight, a=0, mode="fan_out")
    nn.init.zeros_(linear.bias)
    bn = nn.BatchNorm1d(dim)
    nn.init.normal_(bn.weight, 1.0, 0.02)
    nn.init.zeros_(bn.bias)
    return linear, bn


def make_classifier(dim: int, num_classes: int) -> nn.Linear:
    """A fresh identity classifier (FedReIDBench init: N(0, 0.001), zero bias)."""
    classifier = nn.Linear(dim, num_classes)
    nn.init.normal_(classifier.weight, std=0.001)
    nn.init.zeros_(classifier.bias)
    return classifier


class ReIDModel(nn.Module):
    """Backbone + neck + identity classifier.

    ``forward`` returns classifier logits (training); :meth:`embed` returns the neck feature
    (evaluation, and anything that needs the shared representation).
    """

    def __init__(
        self,
        backbone: str = "resnet18",
        num_classes: int = 1,
        pretrained: Pretrained = False,
        neck_dim: int = 512,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        if backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {backbone!r}; choose one of {', '.join(BACKBONES)}")
        resnet = getattr(torchvision.models, backbone)(weights=None)
        if pretrained is True:
            resnet.load_state_dict(imagenet_state_dict(backbone))
        feat_dim = resnet.fc.in_features
        resnet.fc = nn.Identity()
        if isinstance(pretrained, Mapping):
            resnet.load_state_dict(pretrained)  # strict: a file for another backbone is refused here
        self.backbone_name = backbone
        self.backbone = resnet
        self.neck = Neck(feat_dim, neck_dim, dropout)
        self.classifier = make_classifier(neck_dim, num_classes)

    @property
    def feature_dim(self) -> int:
        return self.classifier.in_features

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.neck(self.backbone(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(images))


class MappingNetwork(nn.Sequential):
    """FedReID's mapping network head (Wu & Gong 2021): FC → BN → ReLU → Dropout; a classifier follows."""

    def __init__(self, in_features: int, dim: int = 512, dropout: float = 0.5) -> None:
        super().__init__(*linear_bn(in_features, dim), nn.ReLU(inplace=True), nn.Dropout(dropout))


class MappedReIDModel(ReIDModel):
    """FedReID's client model: the feature embedding network (the backbone, whose pool-5 output is the
    ReID feature) and a local mapping network + classifier. Only the backbone is ever shared."""

    def __init__(self, backbone: str = "resnet18", num_classes: int = 1, pretrained: Pretrained = False,
                 neck_dim: int = 512, dropout: float = 0.5) -> None:
        super().__init__(backbone, num_classes, pretrained=pretrained, neck_dim=neck_dim, dropout=dropout)
        self.neck = MappingNetwork(self.neck[0].in_features, neck_dim, dropout)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.neck(self.backbone(images)))
