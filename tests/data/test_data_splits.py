"""Federated splits: who holds which images, local relabelling, federation-wide labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from secfed.data.splits import by_camera, by_dataset, by_identity
from secfed.data.types import ReidDataset, Sample


def _dataset(name, pids, cameras=(0, 1, 2), per_camera=2):
    train = [Sample(Path(f"/{name}/{pid}_{cam}_{k}.jpg"), pid, cam)
             for pid in pids for cam in cameras for k in range(per_camera)]
    return ReidDataset(name, train, [], [])


def _check_shard(shard):
    assert len(shard.labels) == len(shard.global_labels) == len(shard.samples) == len(shard)
    assert sorted(set(shard.labels)) == list(range(shard.num_classes))
    for sample, label, global_label in zip(shard.samples, shard.labels, shard.global_labels):
        assert shard.label_of[sample.pid] == label
        assert shard.global_label_of[sample.pid] == global_label
        assert 0 <= global_label < shard.num_global_classes


def test_by_dataset_global_labels_are_unique_per_dataset_and_pid():
    a = _dataset("a", [5, 9, 12])
    b = _dataset("b", [5, 7])  # pid 5 again: a different person in another dataset
    shards = by_dataset([a, b])
    assert [s.name for s in shards] == ["a", "b"]
    for shard in shards:
        _check_shard(shard)
        assert shard.num_global_classes == 5
    assert shards[0].samples == tuple(a.train) and shards[1].samples == tuple(b.train)
    assert shards[0].global_label_of == {5: 0, 9: 1, 12: 2}
    assert shards[1].global_label_of == {5: 3, 7: 4}
    assert shards[1].label_of == {5: 0, 7: 1}


def test_by_dataset_rejects_repeated_names_and_empty_train():
    with pytest.raises(ValueError, match="repeated: a"):
        by_dataset([_dataset("a", [1]), _dataset("a", [2])])
    with pytest.raises(ValueError, match="no training images"):
        by_dataset([ReidDataset("empty", [], [], [])])


def test_by_camera_one_client_per_camera_same_person_same_global_label():
    ds = _dataset("m", [3, 4, 8], cameras=(0, 2, 5))
    ds.train.extend([Sample(Path("/m/only5.jpg"), 11, 5)])  # a person only camera 5 saw
    shards = by_camera(ds)
    assert [s.name for s in shards] == ["m/cam0", "m/cam2", "m/cam5"]
    for shard in shards:
        _check_shard(shard)
        assert {s.camid for s in shard.samples} == {int(shard.name[-1])}
        assert shard.num_global_classes == 4
        assert {pid: shard.global_label_of[pid] for pid in (3, 4, 8)} == {3: 0, 4: 1, 8: 2}
    assert shards[2].num_classes == 4 and shards[0].num_classes == 3
    assert shards[2].label_of == {3: 0, 4: 1, 8: 2, 11: 3}
    assert sum(len(s) for s in shards) == len(ds.train)


def test_by_identity_partitions_ids_disjointly_and_evenly():
    ds = _dataset("m", list(range(1, 752)), cameras=(0, 1), per_camera=1)  # Market's 751 train ids
    shards = by_identity(ds, 6, seed=0)
    assert [s.name for s in shards] == [f"m/ids{k}" for k in range(6)]
    groups = [set(s.label_of) for s in shards]
    assert sorted(map(len, groups)) == [125, 125, 125, 125, 125, 126]
    assert set().union(*groups) == set(range(1, 752))
    assert sum(map(len, groups)) == 751  # disjoint
    for shard in shards:
        _check_shard(shard)
        assert shard.num_global_classes == 751
        assert shard.global_label_of == {pid: pid - 1 for pid in shard.label_of}
        assert {s.camid for s in shard.samples} == {0, 1}  # every image of a person goes with them


def test_by_identity_is_seeded():
    ds = _dataset("m", list(range(40)))
    same = [set(s.label_of) for s in by_identity(ds, 4, seed=1)]
    assert same == [set(s.label_of) for s in by_identity(ds, 4, seed=1)]
    assert same != [set(s.label_of) for s in by_identity(ds, 4, seed=2)]


def test_by_identity_bad_client_count():
    ds = _dataset("m", [1, 2, 3])
    with pytest.raises(ValueError, match="between 1 and the 3 train identities"):
        by_identity(ds, 4, seed=0)
    with pytest.raises(ValueError, match="num_clients"):
        by_identity(ds, 0, seed=0)
