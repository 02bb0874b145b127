"""A rank that cannot join the process group fails with one line naming the address and the
interface, in about --collective-timeout-s, and leaves no run folder (ns-train wrote config.yml)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.multiproc import free_port
from tests.helpers.nsrun import cpu_env, ns_bin, run_dir, train_args

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_failed_init_process_group_is_one_line_and_leaves_no_run_folder(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: rank 0 never started
    env = dict(cpu_env(), WORLD_SIZE="2", RANK="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    t0 = time.monotonic()
    proc = subprocess.run(
        [ns_bin("ns-train"), *train_args(tmp_path, "noinit", 4, ["--collective-timeout-s", "5"])],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    elapsed = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    line = [x for x in text.splitlines() if x.startswith("distsplat error")]
    assert (
        line
        and f"could not join the process group through 127.0.0.1:{port}" in line[0]
        and "GLOO_SOCKET_IFNAME" in line[0]
    ), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert not run_dir(tmp_path, "noinit").exists()
    assert elapsed < 120, elapsed  # start-up (imports) plus the 5 s timeout, on a loaded machine
