"""benchmarks/common.py: the one launch command, the child's environment, the machine record."""

from __future__ import annotations

import socket
import sys

import pytest

from benchmarks import common


@pytest.fixture
def ns_train(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(common, "ns_train_executable", lambda: "ns-train")
    return "ns-train"


def test_one_rank_runs_ns_train_itself(ns_train: str) -> None:
    assert common.train_command(["distsplat", "--x", "1"]) == [ns_train, "distsplat", "--x", "1"]


def test_a_module_runs_under_this_python(ns_train: str) -> None:
    assert common.train_command(["ns-train", "distsplat"], module="benchmarks.m") == [
        sys.executable,
        "-m",
        "benchmarks.m",
        "ns-train",
        "distsplat",
    ]


def test_several_ranks_run_under_torch_distributed_run_on_a_local_port(ns_train: str) -> None:
    cmd = common.train_command(["distsplat"], world_size=2, module="benchmarks.m", cores=range(2))
    assert cmd[:4] == ["taskset", "-c", "0,1", sys.executable]
    assert cmd[4:8] == ["-m", "torch.distributed.run", "--nproc_per_node", "2"]
    assert cmd[cmd.index("--master_addr") + 1] == "127.0.0.1"
    assert 0 < int(cmd[cmd.index("--master_port") + 1]) < 65536
    assert cmd[-3:] == ["-m", "benchmarks.m", "distsplat"]


@pytest.mark.parametrize("kwargs", [{"world_size": 0}, {"cores": []}])
def test_bad_launch_settings_are_refused(ns_train: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match="world_size|cores"):
        common.train_command(["distsplat"], **kwargs)


def _flags(args: list[str]) -> dict[str, str]:
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2])
    return dict(zip(args[::2], args[1::2], strict=True))


def test_unattended_run_by_default_never_evaluates_or_saves_mid_run() -> None:
    assert _flags(common.unattended_args()) == {
        "--vis": "tensorboard",
        "--viewer.quit-on-train-completion": "True",
        "--logging.local-writer.enable": "False",
        "--steps-per-eval-batch": "0",
        "--steps-per-eval-image": "0",
        "--steps-per-eval-all-images": "0",
        "--steps-per-save": "0",
    }


def test_unattended_run_with_a_save_period_keeps_every_checkpoint() -> None:
    flags = _flags(common.unattended_args(save_every=25))
    assert (flags["--steps-per-save"], flags["--save-only-latest-checkpoint"]) == ("25", "False")


def test_unattended_run_evaluates_at_step_0_with_a_period_it_never_reaches() -> None:
    assert _flags(common.unattended_args(eval_at_step_0=True))["--steps-per-eval-all-images"] == str(common.ONCE)


def test_a_negative_save_period_is_refused() -> None:
    with pytest.raises(ValueError, match="save_every"):
        common.unattended_args(save_every=-1)


def test_free_port_can_be_bound() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", common.free_port()))


def test_child_env_puts_this_tree_first_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", f"/elsewhere:{common.REPO}")
    env = common.child_env(threads=3, EXTRA="x")
    assert env["PYTHONPATH"].split(":") == [str(common.REPO), "/elsewhere"]
    assert (env["OMP_NUM_THREADS"], env["EXTRA"], env["PYTHONUNBUFFERED"]) == ("3", "x", "1")


def test_machine_record_has_exactly_the_shared_fields() -> None:
    machine = common.machine_record()
    assert tuple(machine) == common.MACHINE_FIELDS and machine["load_average_1min_end"] is None
    assert common.finish_machine_record(machine)["load_average_1min_end"] is not None


def test_run_command_names_the_run_that_failed() -> None:
    with pytest.raises(RuntimeError, match="probe failed \\(exit 3\\)"):
        common.run_command([sys.executable, "-c", "raise SystemExit(3)"], name="probe")
