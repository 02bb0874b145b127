"""The viewer in a real (headless) browser: live while training, and ns-viewer for a finished run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.browser import chromium, distinct_colours, scene_region, screenshot_when, wait_for_http
from tests.helpers.multiproc import free_port
from tests.helpers.nsrun import COLMAP_ARGS, cpu_env, ns_bin, run_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed (scripts/test.sh installs it)"),
]

# The background of viser's canvas is one colour; the rendered splats are a photo of a door.
# Thumbnails of training cameras would also add colours, so they are switched off
# (--viewer.max-num-display-images 0): what remains non-uniform was rendered by the server.
MIN_DISTINCT_COLOURS = 200


def _shows_scene(pixels) -> bool:
    return distinct_colours(scene_region(pixels)) >= MIN_DISTINCT_COLOURS


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("launch", ["one-process", "sharded-two-ranks"])
def test_live_viewer_shows_the_scene_while_training(tmp_path: Path, launch: str) -> None:
    """Sharded: rank 0 holds half the Gaussians and no process gathers the model; rank 0's viewer
    thread posts each frame's camera and both ranks render it at the next step boundary, from
    their shards (docs/sharded.md, "Views rendered by all ranks"), while training goes on: a
    frame showing the scene was rendered by both ranks."""
    port = free_port()
    cmd = [
        ns_bin("ns-train"),
        "distsplat",
        "--output-dir",
        str(tmp_path),
        "--experiment-name",
        "it",
        "--timestamp",
        "live",
        "--machine.device-type",
        "cpu",
        "--max-num-iterations",
        "100000",
        "--vis",
        "viewer",
        "--viewer.websocket-port",
        str(port),
        "--viewer.max-num-display-images",
        "0",
        "--viewer.quit-on-train-completion",
        "True",
        *COLMAP_ARGS,
    ]
    env = cpu_env()
    if launch == "sharded-two-ranks":
        cmd = [ns_bin("torchrun"), "--nproc_per_node", "2", *cmd[:2], "--pipeline.parallel", "sharded", *cmd[2:]]
        env["OMP_NUM_THREADS"] = "1"
    log = tmp_path / "train.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_http(f"http://localhost:{port}", 240, proc)
        pixels = screenshot_when(f"http://localhost:{port}", tmp_path / "live.png", _shows_scene)
        assert proc.poll() is None, f"training stopped while the browser was connected:\n{log.read_text()[-4000:]}"
    finally:
        _stop(proc)
    assert distinct_colours(scene_region(pixels)) >= MIN_DISTINCT_COLOURS


def test_ns_viewer_serves_a_trained_run(tmp_path: Path, trained_run: tuple[Path, str]) -> None:
    out, ts = trained_run
    port = free_port()
    cmd = [
        ns_bin("ns-viewer"),
        "--load-config",
        str(run_dir(out, ts) / "config.yml"),
        "--viewer.websocket-port",
        str(port),
        "--viewer.max-num-display-images",
        "0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cpu_env())
    try:
        wait_for_http(f"http://localhost:{port}", 240, proc)
        pixels = screenshot_when(f"http://localhost:{port}", tmp_path / "viewer.png", _shows_scene)
    finally:
        _stop(proc)
    assert distinct_colours(scene_region(pixels)) >= MIN_DISTINCT_COLOURS
