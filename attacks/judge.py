"""How the audit measures success: the way a ReID adversary does — by identifying the person.

A :class:`Judge` holds a gallery (the client's own images plus distractors: people the client never
saw) embedded twice, with the run's own ReID embedding (:func:`secfed.evaluation.features.extract_features`
of the global model) and by raw pixels (:func:`secfed.evaluation.raw_pixels.raw_pixel_features`).
Given reconstructions and the victims they came from (the images the attacked update was computed
on), it asks for each reconstruction: is its nearest gallery image a picture of one of the victims'
identities? The victims' own images are left out of the gallery, so a hit means the person was
recognised in *other* pictures of them — an exact copy of a noise image identifies no one. Chance is
the share of the remaining gallery those identities hold; the count of hits is tested against it
(:func:`secfed.attacks.verdict.binomial_tail`).

When no other picture of the victims exists (every image of theirs was in the update) each
reconstruction is paired with the victim it resembles most in pixels and only that one image is
left out ("pixel-matched leave-one-out"); the result says which rule was used.

PSNR and SSIM (scikit-image) are taken against the best-matching victim after undoing the training
augmentation's shift and mirror (the reconstruction is of the augmented view).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from secfed.attacks.verdict import LeakTest, binomial_tail, no_test
from secfed.data.augment import crop_flip, scaled_pad
from secfed.evaluation.features import extract_features
from secfed.evaluation.raw_pixels import raw_pixel_features


@dataclass
class Gallery:
    """Images an adversary searches, and whose identity each one shows."""

    images: torch.Tensor  # uint8 (G, 3, H, W)
    identities: list[str]
    from_client: np.ndarray  # bool (G,): the client's own images (the rest are distractors)

    def __post_init__(self) -> None:
        if len(self.identities) != len(self.images) or len(self.from_client) != len(self.images):
            raise ValueError("a gallery needs one identity and one origin per image")


class Judge:
    """Re-identification, PSNR and SSIM of reconstructions against a gallery."""

    def __init__(self, model: torch.nn.Module, gallery: Gallery, *, batch_size: int = 256) -> None:
        self.model = model
        self.gallery = gallery
        self.ids = np.array(gallery.identities, dtype=object)
        self.embedding = extract_features(model, gallery.images, batch_size)
        self.pixels = raw_pixel_features(gallery.images)
        self.pad = scaled_pad(gallery.images.shape[2], gallery.images.shape[3])

    # ---- embeddings of what attacks produce ------------------------------------------------------

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        return extract_features(self.model, images)

    def embed_neck_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        """Recovered neck inputs (pooled backbone features) → the run's ReID feature (the neck's output)."""
        modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        try:
            with torch.no_grad():
                device = next(self.model.parameters()).device
                return F.normalize(self.model.neck(inputs.to(device)).float(), dim=1).cpu()
        finally:
            for m, training in modes:
                m.training = training

    # ---- judging ---------------------------------------------------------------------------------

    def judge_images(self, reconstructions: torch.Tensor, victims: Sequence[int], *,
                     identities: Sequence[set[str]] | None = None, exclude: Sequence[int] | None = None,
                     use_embedding: bool = True) -> tuple[list[dict[str, Any]], dict[str, LeakTest]]:
        """Per-image values and the leak tests for reconstructed images (uint8).

        ``victims``: gallery indices of the images the reconstructions may be of (PSNR and SSIM are
        taken against the best-matching one); ``identities``: per reconstruction, the identities a
        hit must show (default: the victims' identities); ``exclude``: gallery images left out of the
        search (default: the victims). ``use_embedding=False`` keeps the embedding test out of the
        verdict — for an attack that optimised through the same embedding it would grade itself."""
        victims = list(victims)
        pixels = raw_pixel_features(reconstructions)
        matched = self._match_victims(pixels, victims)
        rows = []
        for i, v in enumerate(matched):
            psnr, ssim = self.aligned_psnr_ssim(reconstructions[i], self.gallery.images[v])
            rows.append({"victim": int(v), "victim_identity": str(self.ids[v]), "psnr": psnr, "ssim": ssim})
        targets = self._targets(len(rows), victims, identities)
        left_out = victims if exclude is None else list(exclude)
        tests = {}
        emb = self._reid(self.embed_images(reconstructions), self.embedding, targets, left_out, matched, rows,
                         "embedding")
        if use_embedding:
            tests["reid-embedding"] = emb
        else:
            emb_note = "embedding hit not counted: the attack optimised through this embedding"
            for row in rows:
                row["note"] = emb_note
        tests["reid-pixels"] = self._reid(pixels, self.pixels, targets, left_out, matched, rows, "pixels")
        return rows, tests

    def judge_features(self, embedding: torch.Tensor, victims: Sequence[int]) -> tuple[list[dict[str, Any]], dict[str, LeakTest]]:
        """Re-identification of recovered ReID features (no pixels to compare)."""
        victims = list(victims)
        # Without pixels, pair each feature with the victim whose embedding it is closest to.
        sims = embedding @ self.embedding[victims].T
        matched = [victims[j] for j in sims.argmax(1).tolist()]
        rows = [{"victim": int(v), "victim_identity": str(self.ids[v])} for v in matched]
        targets = self._targets(len(rows), victims, None)
        return rows, {"reid-embedding": self._reid(embedding, self.embedding, targets, victims, matched, rows,
                                                   "embedding")}

    def _targets(self, n: int, victims: list[int], identities: Sequence[set[str]] | None) -> list[set[str]]:
        if identities is None:
            return [{self.ids[v] for v in victims}] * n
        if len(identities) != n:
            raise ValueError(f"{len(identities)} identity sets for {n} reconstructions")
        return [set(s) for s in identities]

    def _match_victims(self, pixels: torch.Tensor, victims: list[int]) -> list[int]:
        """The victim each reconstruction resembles most (pixel correlation, mirror allowed)."""
        mirrored = raw_pixel_features(self.gallery.images[victims].flip(3))
        sims = torch.maximum(pixels @ self.pixels[victims].T, pixels @ mirrored.T)
        return [victims[j] for j in sims.argmax(1).tolist()]

    def _reid(self, query: torch.Tensor, gallery: torch.Tensor, targets: list[set[str]], exclude: list[int],
              matched: list[int], rows: list[dict[str, Any]], space: str) -> LeakTest:
        n = len(self.ids)
        keep = np.ones(n, dtype=bool)
        keep[exclude] = False
        sims = query @ gallery.T
        chances = [float(np.isin(self.ids[keep], list(t)).mean()) if keep.any() else 0.0 for t in targets]
        if max(chances) > 0:
            rule = ("nearest gallery image" + (" (the victims' own images left out)" if exclude else "")
                    + " shows a target identity")
            masked = sims.clone()
            masked[:, torch.from_numpy(~keep)] = -torch.inf
            top = masked.argmax(1).tolist()
            hits = [self.ids[t] in target for t, target in zip(top, targets)]
        else:
            # every picture of the victims was excluded: leave out only the image each one matched
            rule = "nearest gallery image other than the matched victim shows the matched victim's identity"
            top, hits, chances = [], [], []
            for i, v in enumerate(matched):
                row = sims[i].clone()
                row[v] = -torch.inf
                t = int(row.argmax())
                top.append(t)
                hits.append(self.ids[t] == self.ids[v])
                others = np.ones(n, dtype=bool)
                others[v] = False
                chances.append(float((self.ids[others] == self.ids[v]).mean()))
            if max(chances, default=0.0) == 0:
                return no_test("no other picture of any victim's identity in the gallery")
        for row, t, hit in zip(rows, top, hits):
            row[f"{space}_nearest_identity"] = str(self.ids[t])
            row[f"{space}_nearest_index"] = int(t)
            row[f"{space}_hit"] = bool(hit)
        p0 = max(chances)
        k = int(sum(hits))
        return LeakTest(True, k, len(hits), p0, binomial_tail(k, len(hits), p0), f"re-identified by {space}: {rule}")

    def aligned_psnr_ssim(self, reconstruction: torch.Tensor, victim: torch.Tensor) -> tuple[float, float]:
        """Best PSNR and SSIM over the training augmentation's shifts and mirror of ``victim``."""
        pad = self.pad
        views = []
        for flip in (False, True):
            for top in range(2 * pad + 1):
                for left in range(2 * pad + 1):
                    views.append((top, left, flip))
        n = len(views)
        batch = victim.unsqueeze(0).expand(n, -1, -1, -1).contiguous()
        top = torch.tensor([v[0] for v in views])
        left = torch.tensor([v[1] for v in views])
        flip = torch.tensor([v[2] for v in views])
        shifted = crop_flip(batch, pad, top, left, flip)
        rec = reconstruction.permute(1, 2, 0).numpy()
        best_psnr, best_ssim = -np.inf, -np.inf
        for view in shifted:
            ref = view.permute(1, 2, 0).numpy()
            best_psnr = max(best_psnr, float(peak_signal_noise_ratio(ref, rec, data_range=255)))
            best_ssim = max(best_ssim, float(structural_similarity(ref, rec, channel_axis=2, data_range=255)))
        return best_psnr, best_ssim
