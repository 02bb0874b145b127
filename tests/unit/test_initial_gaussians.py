"""The initial Gaussians: splatfacto's draw, and a sharded rank's block of it (``gaussians/initial.py``).

Every comparison is exact (``torch.equal``): a block is the same draws from the same generator and
the same nearest-neighbour search, so no rounding may differ.
"""

from __future__ import annotations

import pytest
import torch
from nerfstudio.data.scene_box import SceneBox
from nerfstudio.models.splatfacto import SplatfactoModelConfig
from torchmetrics.image import lpip

from distsplat_ns.gaussians.initial import initial_gaussians, neighbour_distances
from distsplat_ns.gaussians.ownership import owned_block

KEYS = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


def _points(num: int, with_colours: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(num)
    xyz = torch.randn(num, 3, generator=gen)
    xyz[num // 2] = xyz[0]  # a repeated position: its nearest distance is 0 from either twin
    rgb = (
        (torch.rand(num, 3, generator=gen) * 255).to(torch.uint8)
        if with_colours
        else torch.zeros((0, 3), dtype=torch.uint8)
    )
    return xyz, rgb


CASES = [
    pytest.param({"random_init": True, "num_random": 5, "sh_degree": 3}, None, id="random-5"),  # brute-force search
    pytest.param({"random_init": True, "num_random": 301, "sh_degree": 3}, None, id="random-301"),  # KD-tree
    pytest.param({"sh_degree": 3}, _points(257), id="points-sh3"),
    pytest.param({"sh_degree": 0}, _points(64), id="points-sh0"),
    pytest.param({"sh_degree": 2}, _points(40, with_colours=False), id="points-no-colours"),
]


@pytest.mark.parametrize(("overrides", "points"), CASES)
def test_the_whole_draw_is_splatfactos(overrides: dict, points: tuple | None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Splatfacto builds LPIPS, which downloads AlexNet: a module without weights stands in (no draws).
    monkeypatch.setattr(lpip, "LearnedPerceptualImagePatchSimilarity", lambda **_: torch.nn.Identity())
    # It also moves the seed colours to CUDA (nerfstudio 1.1.5): they stay on the CPU here.
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    config = SplatfactoModelConfig(**overrides)
    torch.manual_seed(11)
    theirs = config.setup(
        scene_box=SceneBox(aabb=torch.tensor([[-1.0] * 3, [1.0] * 3])),
        num_train_data=2,
        metadata={},
        seed_points=points,
    ).gauss_params
    after_theirs = torch.rand(4)
    torch.manual_seed(11)
    ours = initial_gaussians(config, points)
    assert (ours.first_id, ours.num_total) == (0, theirs["means"].shape[0])
    for key in KEYS:
        assert torch.equal(ours.params[key].data, theirs[key].data), key
    assert torch.equal(torch.rand(4), after_theirs)  # the generator ends where splatfacto's does


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize(("overrides", "points"), CASES)
def test_each_ranks_block_is_its_rows_of_the_whole_draw(overrides: dict, points: tuple | None, world: int) -> None:
    config = SplatfactoModelConfig(**overrides)
    torch.manual_seed(5)
    whole = initial_gaussians(config, points)
    after_whole = torch.rand(4)
    for rank in range(world):
        torch.manual_seed(5)
        block = initial_gaussians(config, points, shard=(rank, world))
        lo, hi = owned_block(whole.num_total, rank, world)
        assert (block.first_id, block.num_total) == (lo, whole.num_total)
        for key in KEYS:
            assert torch.equal(block.params[key].data, whole.params[key].data[lo:hi]), (key, rank)
            # Its own storage: a view would keep the whole draw alive.
            assert block.params[key].data.untyped_storage().nbytes() == block.params[key].data.nbytes, key
        assert torch.equal(torch.rand(4), after_whole)


def test_a_block_holds_no_whole_size_tensor() -> None:
    """The memory a sharded rank keeps after the draw is its block's (a slice view would not free)."""
    config = SplatfactoModelConfig(random_init=True, num_random=1000, sh_degree=3)
    block = initial_gaussians(config, None, shard=(1, 4))
    held = sum(p.data.untyped_storage().nbytes() for p in block.params.values())
    assert held == 250 * (3 + 3 + 4 + 3 + 45 + 1) * 4


def test_neighbour_distances_of_a_block_are_the_rows_of_all() -> None:
    points = torch.randn(500, 3, generator=torch.Generator().manual_seed(2))
    whole = neighbour_distances(points, 0, 500, 3)
    assert whole.shape == (500, 3)
    assert (whole[:, :-1] <= whole[:, 1:]).all()  # nearest first
    for lo, hi in [(0, 1), (17, 260), (499, 500), (250, 250)]:
        assert (neighbour_distances(points, lo, hi, 3) == whole[lo:hi]).all()
