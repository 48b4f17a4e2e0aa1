"""A run's progress: steps/s and ETA from its training seconds, plain lines off a terminal, and
the one note when the machine runs much slower than the recipe expects. Driven with made-up
(step, seconds) pairs: no test here waits on a clock."""

from __future__ import annotations

import io

import pytest

from nearsight.core.progress import RateMeter, format_duration, much_slower
from nearsight.training.progress import TrainProgress, slow_machine_note


def run(progress: TrainProgress, seconds_per_step: float, steps: range, start_s: float = 0.0):
    """Feed ``progress`` one update per step at a steady rate; returns the seconds reached."""
    seconds = start_s
    for step in steps:
        seconds += seconds_per_step
        progress.update(step, seconds, loss=1.0, images_per_s=32 / seconds_per_step)
    return seconds


def test_the_rule_is_half_the_expected_rate():
    assert much_slower(1.5, 3.0) and much_slower(0.3, 3.0)
    assert not much_slower(1.6, 3.0) and not much_slower(3.0, 3.0)
    assert much_slower(2.0, 3.0, factor=1.5) and not much_slower(2.1, 3.0, factor=1.5)


def test_rate_meter_leaves_start_up_out():
    meter = RateMeter(skip=5)
    meter.update(0, 0.0)
    for step in range(1, 6):  # five slow start-up steps: 4 s each
        meter.update(step, 4.0 * step)
    assert meter.rate is None and meter.measured == (0, 0.0)
    for step in range(6, 16):  # then 2 steps/s
        meter.update(step, 20.0 + 0.5 * (step - 5))
    assert meter.measured == (10, 5.0)
    assert meter.rate == pytest.approx(2.0)
    assert meter.eta(115) == pytest.approx(50.0)  # 100 steps left at 2 steps/s
    assert meter.eta(10) == 0.0


def test_format_duration():
    assert [format_duration(s) for s in (0, 44.6, 60, 185, 3599, 3720)] == [
        "0s",
        "45s",
        "1m00s",
        "3m05s",
        "59m59s",
        "1h02m",
    ]


def test_plain_lines_carry_steps_per_second_and_eta():
    out = io.StringIO()  # not a terminal: plain lines, at most one per 10 s of training
    progress = TrainProgress(total_steps=300, bar=False, every_s=10.0, out=out)
    run(progress, 0.5, range(1, 101))  # 2 steps/s for 50 s
    progress.close()
    lines = out.getvalue().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    # the first once start-up (5 steps) is timed, then every 10 s: 3, 13, 23, 33, 43 s
    assert [line.split()[1] for line in steps] == ["6/300", "26/300", "46/300", "66/300", "86/300"]
    assert steps[0] == "step 6/300 loss 1.0000 64.0 img/s 2.00 steps/s ETA 2m27s"
    assert steps[-1].endswith("2.00 steps/s ETA 1m47s")
    assert lines[-1] == "train: 100 steps in 50.0s of training (2.00 steps/s after start-up)"
    assert not any("slower" in line for line in lines)  # no expected rate, no judgement


def test_a_time_limited_run_counts_down_its_limit():
    out = io.StringIO()
    progress = TrainProgress(total_steps=None, time_limit_s=180.0, bar=False, out=out)
    run(progress, 0.5, range(1, 31))  # lines at 3 s (step 6) and 13 s (step 26)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 6/? ") and lines[0].endswith("ETA 2m57s")
    assert lines[1].startswith("step 26/? ") and lines[1].endswith("ETA 2m47s")


def test_a_slow_machine_is_told_once_what_it_costs_and_what_to_do():
    out = io.StringIO()
    progress = TrainProgress(total_steps=800, expected_steps_per_s=3.0, bar=False, out=out)
    seconds = run(progress, 1.0, range(1, 20))  # 1 step/s: 3x slower, but only 14 s measured
    assert "slower" not in out.getvalue()  # too early to judge
    run(progress, 1.0, range(20, 200), start_s=seconds)
    notes = [line for line in out.getvalue().splitlines() if "slower" in line]
    assert len(notes) == 1, notes
    note = notes[0]
    assert note.startswith("nearsight: note: training runs at 1.00 steps/s, 3.0x slower than ")
    assert "the 3.00 steps/s this recipe expects" in note
    # judged after 20 s measured: 5 steps of start-up + 20 steps -> 25 done, 775 left
    assert "the 800 steps take about 12m55s more" in note
    # 800 steps were planned at 3 steps/s = 4m27s; at 1 step/s that time holds 266 steps
    assert "--steps 266 ends in the 4m27s the recipe was sized for" in note


def test_a_machine_near_the_expected_rate_hears_nothing():
    out = io.StringIO()
    progress = TrainProgress(total_steps=800, expected_steps_per_s=3.0, bar=False, out=out)
    run(progress, 1 / 1.6, range(1, 200))  # 1.6 steps/s: slower, not much slower
    assert "slower" not in out.getvalue()


def test_a_slow_time_limited_run_is_told_it_learns_less():
    note = slow_machine_note(0.5, 3.0, done=30, total_steps=None, time_limit_s=180.0)
    assert "the 180s time limit makes about 90 steps instead of 540" in note
    assert "--steps N trains N steps whatever the speed" in note


def test_a_resumed_run_measures_from_where_it_resumed():
    out = io.StringIO()
    progress = TrainProgress(
        total_steps=800, initial=400, initial_seconds=130.0, expected_steps_per_s=3.0,
        bar=False, out=out,
    )  # fmt: skip
    run(progress, 1 / 3, range(401, 500), start_s=130.0)
    assert "slower" not in out.getvalue()
    assert progress.meter.rate == pytest.approx(3.0)


def test_only_the_main_process_prints():
    out = io.StringIO()
    progress = TrainProgress(
        total_steps=800, expected_steps_per_s=3.0, enabled=False, bar=False, out=out
    )
    run(progress, 1.0, range(1, 200))
    progress.close()
    assert out.getvalue() == ""


def test_on_a_terminal_a_bar_shows_steps_per_second_and_eta():
    out = io.StringIO()
    progress = TrainProgress(total_steps=800, expected_steps_per_s=3.0, bar=True, out=out)
    run(progress, 1.0, range(1, 40))
    progress.close()
    text = out.getvalue()
    assert "train:" in text and "/800" in text and "step/s" in text and "<" in text  # tqdm's ETA
    assert not any(line.startswith("step ") for line in text.replace("\r", "\n").splitlines())
    notes = [line for line in text.replace("\r", "\n").splitlines() if "slower" in line]
    assert len(notes) == 1 and notes[0].startswith("nearsight: note: training runs at 1.00")
