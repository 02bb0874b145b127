"""The float64 mode's initial Gaussians (repeated seed positions kept once), its Adam eps, and
its dtype kept across a checkpoint load."""

from __future__ import annotations

import torch

from distsplat_ns.gaussians.initial import unique_seed_points


def test_keeps_the_first_occurrence_of_each_position_in_order() -> None:
    xyz = torch.tensor([[1.0, 2, 3], [0, 0, 0], [1, 2, 3], [5, 5, 5], [0, 0, 0], [1, 2, 3.0000002]])
    rgb = torch.arange(18, dtype=torch.uint8).reshape(6, 3)
    out_xyz, out_rgb = unique_seed_points((xyz, rgb))
    # rows 2 and 4 repeat rows 0 and 1; row 5 differs in the last float32 bit and is kept.
    assert torch.equal(out_xyz, xyz[[0, 1, 3, 5]])
    assert torch.equal(out_rgb, rgb[[0, 1, 3, 5]])


def test_without_repeats_is_the_identity() -> None:
    gen = torch.Generator().manual_seed(0)
    xyz = torch.randn(100, 3, generator=gen)
    rgb = torch.randint(0, 256, (100, 3), generator=gen, dtype=torch.uint8)
    out_xyz, out_rgb = unique_seed_points((xyz, rgb))
    assert torch.equal(out_xyz, xyz) and torch.equal(out_rgb, rgb)


def test_does_not_depend_on_anything_but_the_points() -> None:
    # Every rank builds its initial Gaussians from the same point cloud: the kept rows must be a
    # function of the points alone (no generator, no order that varies between calls).
    gen = torch.Generator().manual_seed(1)
    base = torch.randint(0, 4, (500, 3), generator=gen).float()  # many repeats
    rgb = torch.randint(0, 256, (500, 3), generator=gen, dtype=torch.uint8)
    torch.manual_seed(123)
    first = unique_seed_points((base, rgb))
    torch.manual_seed(456)
    second = unique_seed_points((base.clone(), rgb.clone()))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert len(first[0]) == len(torch.unique(base, dim=0))
    # each kept row is the first row with its position
    for row in first[0]:
        i = int(torch.nonzero((base == row).all(dim=1))[0])
        assert torch.equal(first[1][(first[0] == row).all(dim=1)][0], rgb[i])


def test_empty_cloud() -> None:
    xyz, rgb = torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.uint8)
    out = unique_seed_points((xyz, rgb))
    assert out[0].shape == (0, 3) and out[1].shape == (0, 3)


def test_float64_optimizers_raise_the_eps_of_the_gaussian_parameters_only() -> None:
    from nerfstudio.engine.optimizers import AdamOptimizerConfig

    from distsplat_ns.registry import distsplat
    from distsplat_ns.trainer.optimizer_rules import FLOAT64_ADAM_EPS, GAUSSIAN_PARAM_GROUPS, float64_optimizer_configs

    configs = distsplat.config.optimizers
    out = float64_optimizer_configs(configs)
    assert set(GAUSSIAN_PARAM_GROUPS) <= set(configs), "splatfacto's groups were renamed"
    for name in configs:
        expected = (
            max(FLOAT64_ADAM_EPS, configs[name]["optimizer"].eps)
            if name in GAUSSIAN_PARAM_GROUPS
            else configs[name]["optimizer"].eps
        )
        assert out[name]["optimizer"].eps == expected, name
    assert FLOAT64_ADAM_EPS == 1e-8 and out["camera_opt"]["optimizer"].eps == configs["camera_opt"]["optimizer"].eps
    assert configs["quats"]["optimizer"].eps == 1e-15, "the input configuration was changed"
    # a larger eps chosen by the user is kept
    big = {"quats": {"optimizer": AdamOptimizerConfig(lr=1e-3, eps=1e-6), "scheduler": None}}
    assert float64_optimizer_configs(big)["quats"]["optimizer"].eps == 1e-6


def test_loading_a_checkpoint_keeps_float64_parameters_bit_for_bit() -> None:
    """Splatfacto's load re-creates the parameters for the checkpoint's count with torch.zeros in
    the default dtype (float32): a float64-mode resume must not drop to float32 (a sharded MCMC
    resume did, tests/multiproc/test_mcmc_training.py)."""
    from tests.helpers.model_factory import make_model

    saved = make_model(1, num_points=40, param_dtype="float64")
    with torch.no_grad():
        saved.gauss_params["means"] += 1e-12  # survives only in float64
    resumed = make_model(1, num_points=30, param_dtype="float64")
    resumed.load_state_dict(saved.state_dict())
    for name, param in saved.gauss_params.items():
        assert resumed.gauss_params[name].dtype == torch.float64 and torch.equal(resumed.gauss_params[name], param)
    assert torch.get_default_dtype() == torch.float32
