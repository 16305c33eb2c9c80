"""secfed: privacy-hardened federated learning for person re-identification.

This top-level module stays import-light on purpose: ``secfed.protocols`` lives under it and must be
importable without torch, so nothing here may import torch, torchvision or any torch-using module.
"""

__version__ = "0.1.0"
