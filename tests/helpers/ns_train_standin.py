"""ns-train with "the device" a CPU stand-in for CUDA (tests/helpers/device_standin.py).

Usage (plain or under torchrun): ``ns_train_standin.py <ns-train arguments>`` with
``--machine.device-type cuda``. The stand-in is installed in this process, nerfstudio's ``ns-train``
entry point runs in it, and with ``DISTSPLAT_STANDIN_REPORT=PATH`` each rank writes its copy counts
to ``PATH.rank<R>`` at the end (the steps are the calls of the pipeline's
``train_iteration``, nerfstudio's trainer's step), with the stand-in allocator's figures
(tests/helpers/device_memory.py): its peak per device over the whole run, and at each memory-budget
event the Gaussians held and the allocator's peak since the previous event, read before the budget does,
and (``DISTSPLAT_STANDIN_PEAK_SITES=1``) the live bytes per creating place at that peak
(``device_peak_sites``).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

if "tests.helpers" not in sys.modules:  # run as a script: the repository it is in, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from tests.helpers import device_memory, device_standin

    budget_events: list[dict] = []
    with device_standin.installed() as counter:
        from distsplat_ns.gaussians.budget_measured import RankBudget
        from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

        caps_fn = RankBudget.caps

        @functools.wraps(caps_fn)
        def recorded_caps(self, num_held: int):
            budget_events.append(
                {
                    "step": counter.step,
                    "held": num_held,
                    "allocator_peak": device_memory.max_memory_allocated(self.ctx.device),
                }
            )
            return caps_fn(self, num_held)

        RankBudget.caps = recorded_caps

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
                device_standin.write_report(
                    os.environ["DISTSPLAT_STANDIN_REPORT"],
                    device_peak_bytes=device_memory.run_peak_bytes(),
                    device_peak_sites=device_memory.peak_sites(),
                    budget_events=budget_events,
                )


if __name__ == "__main__":
    main()
