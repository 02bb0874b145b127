"""The command line reports bad input as its whole message and keeps internal errors' tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from distsplat_ns.distributed.reporting import report_user_errors
from distsplat_ns.utils.errors import RunFailure, UserError


class _Runner:
    def __init__(self, error: BaseException, base_dir: Path | None = None) -> None:
        self.error = error
        self.base_dir = base_dir

    @report_user_errors
    def run(self) -> None:
        raise self.error


def test_user_error_is_reported_whole() -> None:
    message = "3 image files are missing under --data /x:\n  images/a.jpg\n  images/b.jpg\n  images/c.jpg"
    with pytest.raises(SystemExit) as info:
        _Runner(UserError(message)).run()
    assert str(info.value.code) == f"distsplat error (rank 0): {message}"


def test_missing_file_is_reported_with_its_path() -> None:
    with pytest.raises(SystemExit) as info:
        _Runner(FileNotFoundError(2, "No such file or directory", "/data/images/a.jpg")).run()
    assert "/data/images/a.jpg" in str(info.value.code)


def test_run_failure_is_reported_whole() -> None:
    with pytest.raises(SystemExit) as info:
        _Runner(RunFailure("writing checkpoint step-000000010.ckpt failed: No space left on device")).run()
    assert "No space left on device" in str(info.value.code)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("shapes [3, 4] and [3, 5] differ"),
        IndexError("index 7 is out of bounds"),
        AssertionError("internal invariant"),
    ],
)
def test_internal_errors_keep_their_type_and_traceback(error: BaseException) -> None:
    with pytest.raises(type(error)) as info:
        _Runner(error).run()
    assert info.value is error and info.traceback


def test_failed_start_removes_the_run_folder_holding_only_its_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yml").write_text("x")
    with pytest.raises(AssertionError):
        _Runner(AssertionError("nerfstudio's data check"), base_dir=run).run()
    assert not run.exists()


def test_failed_start_keeps_a_run_folder_with_anything_else(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "nerfstudio_models").mkdir(parents=True)
    (run / "config.yml").write_text("x")
    with pytest.raises(SystemExit):
        _Runner(UserError("bad flag"), base_dir=run).run()
    assert (run / "nerfstudio_models").is_dir()
