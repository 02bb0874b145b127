"""Headless Chromium screenshots of the nerfstudio viewer (flags that work headless and offline on these machines)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np

CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def wait_for_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f}s")


def screenshot_when(url: str, out: Path, ready, timeout_s: float = 240.0) -> np.ndarray:
    """Open ``url`` in headless Chromium (driven by Playwright) and take screenshots until
    ``ready(pixels)`` holds or ``timeout_s`` real seconds pass; returns the last RGB pixels.

    Real time matters: the server renders on its own schedule (between training steps on CPU), and
    chromium's --virtual-time-budget can run out in far less wall time.
    """
    import io

    from PIL import Image
    from playwright.sync_api import sync_playwright

    exe = chromium()
    assert exe is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport={"width": 800, "height": 600})
            page.goto(url, timeout=60_000)
            deadline = time.time() + timeout_s
            while True:
                png = page.screenshot()
                pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
                if ready(pixels) or time.time() > deadline:
                    out.write_bytes(png)
                    return pixels
                time.sleep(2)
        finally:
            browser.close()


def scene_region(pixels: np.ndarray) -> np.ndarray:
    """The 3D canvas of nerfstudio's viewer at 800x600: left of the control panel, below the top
    bar, above the axes gizmo."""
    return pixels[70:520, 80:460]


def distinct_colours(region: np.ndarray) -> int:
    return len(np.unique(region.reshape(-1, 3), axis=0))
