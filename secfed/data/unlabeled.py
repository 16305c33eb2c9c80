"""A folder of person images used without labels: the public set of knowledge distillation.

Layout::

    ROOT/**/<any name>.jpg|.jpeg|.png|.bmp   every image under ROOT, sub-folders included (what
                                             `secfed data synth --public` writes is one flat folder)

MM'20 (FedPav + KD, Alg. 2) has every client compute soft labels on a public set and the server
distil them; only the images are used. Every image is returned as ``train`` with pid and camid
:data:`~secfed.data.types.UNLABELED` (-1); query and gallery are empty. A folder without images
is a DataError naming it. (CUHK02, the paper's public set, has its own loader with its labels.)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from secfed.data.listing import list_tree, require_dir, require_some
from secfed.data.types import UNLABELED, ReidDataset, Sample

LAYOUT = "ROOT/**/*.jpg (person images, in sub-folders or not; their names and labels are not used)"


def load_unlabeled(root: Path) -> ReidDataset:
    skipped: Counter[str] = Counter()
    images = require_some(list_tree(require_dir(root, LAYOUT), skipped), root)
    return ReidDataset("unlabeled", [Sample(path, UNLABELED, UNLABELED) for path in images], [], [], dict(skipped))
