"""Step times for the draft budget: estimates seeded at capture and replaced by measurements,
and device timing that never waits for the device."""

from __future__ import annotations

import pytest

from shardinfer.engine.step_timer import STALE_AFTER, WINDOW, StepTimer, StepTimes


def test_the_first_measurement_replaces_the_seed_and_later_ones_average() -> None:
    times = StepTimes({(2, 8): 5.0})
    assert times.ms(2, 8) == 5.0 and times.ms(3, 8) is None
    times.observe(2, 8, 9.0)
    assert times.ms(2, 8) == 9.0
    times.observe(2, 8, 12.0)
    assert times.ms(2, 8) == pytest.approx((9.0 + 12.0) / 2)
    times.observe(2, 8, 6.0)
    assert times.ms(2, 8) == pytest.approx((9.0 + 12.0 + 6.0) / 3)
    times.observe(2, 8, -1.0)  # not a time: ignored
    assert times.ms(2, 8) == pytest.approx(9.0)


def test_the_running_mean_forgets_beyond_its_window() -> None:
    times = StepTimes(None)
    for _ in range(WINDOW):
        times.observe(1, 4, 10.0)
    times.observe(1, 4, 18.0)  # weight 1 / WINDOW from now on
    assert times.ms(1, 4) == pytest.approx(10.0 + (18.0 - 10.0) / WINDOW)


def test_a_width_not_run_for_long_is_measured_afresh() -> None:
    times = StepTimes(None)
    for _ in range(3):
        times.observe(2, 4, 10.0)
    for _ in range(STALE_AFTER + 1):  # the bucket runs another width meanwhile
        times.observe(1, 4, 7.0)
    times.observe(2, 4, 16.0)  # contexts grew since: the old estimate is dropped
    assert times.ms(2, 4) == 16.0
    times.observe(1, 4, 9.0)  # width 1 was measured all along: averaged
    assert times.ms(1, 4) == pytest.approx(7.0 + (9.0 - 7.0) / WINDOW)


class FakeEvent:
    """A device event on a fake clock: done once the test says the device got that far. It has no
    synchronize(): a timer that waited would fail here."""

    def __init__(self, device: dict[str, float]) -> None:
        self.device = device
        self.at: float | None = None

    def record(self) -> None:
        self.at = self.device["queued"]

    def query(self) -> bool:
        assert self.at is not None
        return self.at <= self.device["done"]

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "read before both events completed"
        assert self.at is not None and end.at is not None
        return end.at - self.at


def test_the_timer_reads_finished_steps_in_order_without_waiting() -> None:
    device = {"queued": 0.0, "done": -1.0}
    timer = StepTimer(lambda: FakeEvent(device))
    for key, ms in (("a", 4.0), ("b", 6.0), ("c", 5.0)):
        start = timer.start()
        device["queued"] += ms
        timer.stop(start, key)
    assert timer.poll() == []  # nothing finished
    device["done"] = 10.0  # the device finished a and b, not c
    assert timer.poll() == [("a", 4.0), ("b", 6.0)]
    assert timer.poll() == []
    device["done"] = 15.0
    assert timer.poll() == [("c", 5.0)]
    assert not timer.pending


def test_a_bucket_not_measured_yet_borrows_the_nearest_measurement_scaled_by_the_seeds() -> None:
    times = StepTimes({(2, 256): 21.0, (2, 224): 19.0, (2, 32): 8.0, (1, 224): 18.0})
    times.observe(2, 256, 66.6)
    assert times.ms(2, 224) == pytest.approx(66.6 * 19.0 / 21.0)
    assert times.ms(1, 224) == 18.0  # width 1 was measured nowhere: its seed
    times.observe(2, 32, 10.0)
    assert times.ms(2, 224) == pytest.approx(66.6 * 19.0 / 21.0)  # 256 is nearer than 32
    assert times.ms(2, 48) is None  # no seed there: nothing to scale
    times.observe(2, 224, 50.0)
    assert times.ms(2, 224) == 50.0  # its own measurement


def test_a_step_costs_the_larger_of_its_device_and_paced_times() -> None:
    times = StepTimes({(1, 8): 4.0, (2, 8): 4.2})
    times.observe(2, 8, 5.0)
    times.observe_paced(2, 8, 9.0)  # the host took longer than the device: the host's time counts
    assert times.ms(2, 8) == 9.0
    times.observe(1, 8, 6.0)
    times.observe_paced(1, 8, 3.0)  # the device took longer: the device's time counts
    assert times.ms(1, 8) == 6.0
    # A paced time is kept for its own (width, bucket) only; elsewhere the device estimate rules.
    assert times.ms(2, 16) is None
    assert times.ms(2, 8) == 9.0 and times.paced.estimate == {(2, 8): 9.0, (1, 8): 3.0}
