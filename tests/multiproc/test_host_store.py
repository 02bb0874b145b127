"""One encoded store per host (issue 27): the local ranks share one read-only buffer filled once by
the host's lowest rank, mapped by every local rank and its DataLoader workers; the host's budget
and disk mode are the leader's decision; with several hosts each has its own store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import host_store_fns
from tests.helpers.data_fixtures import write_nerfstudio_scene
from tests.helpers.multiproc import run_ranks


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    from tests.helpers.data_fixtures import write_images

    folder = tmp_path_factory.mktemp("host_store")
    return [str(p) for p in write_images(folder, [(48, 64)] * 10, seed=3)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_local_ranks_map_one_read_only_store_filled_once(paths: list[str], world_size: int) -> None:
    results = run_ranks(host_store_fns.shared_store_rank, world_size, paths, [1 << 30] * world_size)
    assert [r["is_filler"] for r in results] == [True] + [False] * (world_size - 1)
    assert all(r["num_local_ranks"] == world_size and r["leader"] == 0 for r in results)
    assert all(r["filled"] and r["exact"] and not r["disk_mode"] for r in results)
    assert len({tuple(r["inodes"]) for r in results}) == 1 and len(results[0]["inodes"]) == 1  # one memfd, the same
    assert results[0]["writable"] is True and all(r["writable"] is False for r in results[1:])


def test_each_host_has_its_own_store(paths: list[str]) -> None:
    hosts = ["a", "a", "b", "b"]
    results = run_ranks(host_store_fns.shared_store_rank, 4, paths, [1 << 30] * 4, hosts)
    assert [r["is_filler"] for r in results] == [True, False, True, False]
    assert [r["leader"] for r in results] == [0, 0, 2, 2]
    assert results[0]["inodes"] == results[1]["inodes"] != results[2]["inodes"] == results[3]["inodes"]
    assert all(r["exact"] for r in results)


def test_disk_mode_is_decided_once_per_host_by_its_leader(paths: list[str]) -> None:
    total = sum(Path(p).stat().st_size for p in paths)
    # The leader's budget counts: its host is in RAM mode although rank 1's own budget is too small ...
    ram = run_ranks(host_store_fns.shared_store_rank, 2, paths, [total, total - 1])
    assert not any(r["disk_mode"] for r in ram) and all(r["budget_bytes"] == total for r in ram)
    # ... and in disk mode on every local rank when the leader's is, logged once, by the leader.
    disk = run_ranks(host_store_fns.shared_store_rank, 3, paths, [total - 1, total, total])
    assert all(r["disk_mode"] and r["exact"] and r["inodes"] == [] for r in disk)
    assert [r["disk_mode_logged"] for r in disk] == [1, 0, 0]


def test_datamanager_ranks_and_their_workers_map_the_host_store(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=8, size_hw=(40, 56))
    results = run_ranks(host_store_fns.shared_datamanager_rank, 2, str(scene))
    assert [r["stats"]["store_filler"] for r in results] == [True, False]
    assert all(r["stats"]["store_num_local_ranks"] == 2 and r["stats"]["disk_mode"] is False for r in results)
    inode = results[0]["inodes"]
    assert len(inode) == 1 and results[1]["inodes"] == inode
    assert all(w == inode for r in results for w in r["worker_inodes"]) and all(
        len(r["worker_inodes"]) == 1 for r in results
    )
    assert all(r["exact"] for r in results)
