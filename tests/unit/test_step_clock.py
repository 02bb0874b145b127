"""The step's clocks: PhaseClock's accounting (nested phases counted once, under their own names;
a blocking collective, ``communicating``, in its phase and once in ``exposed_comm``) and the
periodic checks' rule."""

from __future__ import annotations

import pytest
from nerfstudio.utils.misc import step_check

from distsplat_ns.utils import timing
from distsplat_ns.utils.timing import PhaseClock


class FakeTime:
    """A perf_counter the test advances by hand: the accounting is checked exactly, never timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(timing.time, "perf_counter", fake.perf_counter)
    return fake


def test_a_collective_inside_the_forward_counts_as_communication_not_render_time(fake_time: FakeTime) -> None:
    clock = PhaseClock()
    with clock.phase("forward"):
        fake_time.now += 1.0  # rendering
        with clock.communicating():  # an exchange inside the forward
            fake_time.now += 2.0
            with clock.communicating():  # its part, timed inside the whole
                fake_time.now += 4.0
        fake_time.now += 8.0
    assert clock["forward"] == 9.0
    assert clock["all_reduce"] == 6.0
    assert clock["exposed_comm"] == 6.0  # the nested block once


def test_a_collective_outside_any_phase_counts_only_as_exposed_communication(fake_time: FakeTime) -> None:
    clock = PhaseClock()
    with clock.communicating(phase=None):
        fake_time.now += 3.0
    assert clock["exposed_comm"] == 3.0
    assert clock.seconds.keys() == {"exposed_comm"}


def test_a_check_every_k_steps_runs_on_the_multiples_of_k_and_never_at_zero() -> None:
    # The rule train_step's periodic checks use (nerfstudio's step_check, step 0 included).
    assert [s for s in range(7) if step_check(s, 3, run_at_zero=True)] == [0, 3, 6]
    assert not any(step_check(s, 0, run_at_zero=True) for s in range(7))
