"""RSS: the encoded bytes are held once for the whole process tree; workers add no copy of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data_fixtures import write_images

REPO = Path(__file__).resolve().parents[2]
NUM_SMALL, NUM_LARGE = 8, 128


def _measure(paths: list[Path], out: Path) -> dict:
    code = (
        "import sys, json; from pathlib import Path\n"
        "from tests.helpers.data_fixtures import measure_stream_memory\n"
        "paths = [Path(p) for p in json.loads(sys.argv[1])]\n"
        "measure_stream_memory(paths, batch_size=4, num_workers=2, num_steps=8, out_json=Path(sys.argv[2]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code, json.dumps([str(p) for p in paths]), str(out)], cwd=REPO, env=env, check=True, timeout=120)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("noisy")
    # Noisy 600x800 JPEGs (~0.4 MB each), repeated through symlinks: every path is its own entry.
    sources = write_images(folder / "src", [(600, 800)] * 4, seed=1, noise=60.0)
    links = []
    for i in range(NUM_LARGE):
        link = folder / f"frame_{i:04d}.jpg"
        os.symlink(sources[i % len(sources)], link)
        links.append(link)
    return {
        "small": _measure(links[:NUM_SMALL], folder / "small.json"),
        "large": _measure(links, folder / "large.json"),
    }


def test_tree_memory_grows_by_at_most_the_encoded_bytes(memory: dict[str, dict]) -> None:
    extra_bytes = memory["large"]["store_bytes"] - memory["small"]["store_bytes"]
    extra_pss = memory["large"]["pss"] - memory["small"]["pss"]
    # PSS counts each shared page once across the tree; 1.3x is issue #3's target, plus 8 MiB of
    # interpreter noise between two fresh processes.
    assert extra_pss <= 1.3 * extra_bytes + (8 << 20), (extra_pss, extra_bytes)


def test_workers_hold_no_private_copy_of_the_bytes(memory: dict[str, dict]) -> None:
    extra_bytes = memory["large"]["store_bytes"] - memory["small"]["store_bytes"]
    extra_worker_uss = memory["large"]["worker_uss"] - memory["small"]["worker_uss"]
    assert memory["large"]["num_processes"] == 3
    assert extra_worker_uss <= 0.1 * extra_bytes, (extra_worker_uss, extra_bytes)
