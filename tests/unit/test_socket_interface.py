"""The socket interface picked when the hostname resolves to loopback (distributed/interfaces.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import psutil
import pytest

from distsplat_ns.distributed.interfaces import choose_socket_interface
from tests.helpers.nsrun import REPO


def _routable_interface() -> tuple:
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return name, a.address
    pytest.skip("no non-loopback IPv4 interface on this machine")


@pytest.fixture
def loopback_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")


def test_picks_the_interface_that_routes_to_the_master_address(loopback_hostname: None) -> None:
    name, address = _routable_interface()
    env = {"MASTER_ADDR": address, "MASTER_PORT": "29400"}
    assert choose_socket_interface("gloo", env) == name
    assert env["GLOO_SOCKET_IFNAME"] == name


def test_nccl_sets_both_variables(loopback_hostname: None) -> None:
    name, address = _routable_interface()
    env = {"MASTER_ADDR": address, "MASTER_PORT": "29400"}
    choose_socket_interface("nccl", env)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == name


@pytest.mark.parametrize(
    "env", [{"MASTER_ADDR": "127.0.0.1"}, {"MASTER_ADDR": "10.1.2.3", "GLOO_SOCKET_IFNAME": "eth9"}, {}]
)
def test_leaves_one_host_runs_and_explicit_settings_alone(loopback_hostname: None, env: dict) -> None:
    before = dict(env)
    assert choose_socket_interface("gloo", env) is None
    assert env == before


def test_no_route_fails_at_once_naming_the_variable() -> None:
    """In a namespace holding only a loopback there is no route to anywhere."""
    name = f"dsif{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False).returncode != 0:
        pytest.skip("ip netns refused here (needs root): the no-route case needs an empty network namespace")
    try:
        code = (
            "import socket; socket.gethostname = lambda: 'localhost';"
            "from distsplat_ns.distributed.interfaces import choose_socket_interface as c;"
            "c('gloo', {'MASTER_ADDR': '10.77.250.1', 'MASTER_PORT': '29400'})"
        )
        proc = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            check=False,
        )
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    assert proc.returncode != 0
    assert "no interface routes to the rendezvous address MASTER_ADDR=10.77.250.1" in proc.stderr, proc.stderr[-2000:]
    assert "set GLOO_SOCKET_IFNAME" in proc.stderr, proc.stderr[-2000:]
