"""Pixel conventions shared by training and evaluation.

Images live in memory as uint8 tensors (N, 3, H, W) at the model's input size; they become floats
only batch by batch, normalised with the ImageNet statistics every torchvision ResNet expects.
"""

from __future__ import annotations

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) in [0, 255] → float32 normalised with the ImageNet mean and std."""
    # One float copy and two in-place ops: (x/255 − mean)/std == (x − 255·mean)/(255·std).
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=images.device).view(1, 3, 1, 1) * 255.0
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=images.device).view(1, 3, 1, 1) * 255.0
    return images.float().sub_(mean).div_(std)

