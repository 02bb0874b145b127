"""ns-train with "the device" a CPU stand-in for CUDA (tests/helpers/device_standin.py).

Usage (plain or under torchrun): ``ns_train_standin.py <ns-train arguments>`` with
``--machine.device-type cuda``. The stand-in is installed in this process, nerfstudio's ``ns-train``
entry point runs in it, and with ``DISTSPLAT_STANDIN_REPORT=PATH`` each rank writes its copy counts
to ``PATH.rank<R>`` at the end (the steps are the calls of the pipeline's
``train_iteration``, nerfstudio's trainer's step).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

if "tests.helpers" not in sys.modules:  # run as a script: the repository it is in, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from tests.helpers import device_standin

    with device_standin.installed() as counter:
        from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

        step_fn = DistSplatTrainer.train_iteration

        @functools.wraps(step_fn)
        def counted_step(self, step: int):
            counter.in_step, counter.step = True, step
            counter.steps.append(step)
            try:
                return step_fn(self, step)
            finally:
                counter.in_step = False

        DistSplatTrainer.train_iteration = counted_step
        from nerfstudio.scripts.train import entrypoint

        try:
            entrypoint()
        finally:
            if os.environ.get("DISTSPLAT_STANDIN_REPORT"):
                device_standin.write_report(os.environ["DISTSPLAT_STANDIN_REPORT"])


if __name__ == "__main__":
    main()
