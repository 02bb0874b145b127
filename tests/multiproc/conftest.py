"""Runs shared by the multi-process training tests (session scope: each trains once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.equivalence import EQUIV_EXTRA
from tests.helpers.nsrun import run_ns_train, run_torchrun


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one")
    run_ns_train(out, "one", 100, extra=EQUIV_EXTRA)
    return out


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two")
    run_torchrun(out, "two", 100, 2, extra=EQUIV_EXTRA)
    return out
