"""cpu_threads: measured: the probe times real steps at each thread count and keeps the fastest."""

from __future__ import annotations

import pytest
import torch

from nearsight.core.errors import NearsightError
from nearsight.training.config import load_config
from nearsight.training.config_checks import validate
from nearsight.training.thread_probe import DRIFT, RECENT, SKIP_STEPS, ThreadProbe


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_steps(probe: ThreadProbe, start: int, count: int, seconds_at: dict[int, float]) -> list:
    """``count`` steps from ``start``; each takes ``seconds_at[threads]``; the counts used."""
    used = []
    for step in range(start, start + count):
        probe.before_step(step)
        threads = torch.get_num_threads()
        used.append(threads)
        probe.after_step(step + 1, seconds_at[threads])
    return used


def test_the_probe_keeps_the_fastest_count_and_measures_again(torch_threads, capsys):
    probe = ThreadProbe(4, steps_each=3)
    assert probe.choices == [4, 2, 1]
    busy = {4: 0.9, 2: 0.5, 1: 0.7}  # two of four cores held by other work
    used = run_steps(probe, 0, SKIP_STEPS + 9 + 30, busy)
    assert used[:SKIP_STEPS] == [4] * SKIP_STEPS  # warm-up steps: not timed
    assert used[SKIP_STEPS : SKIP_STEPS + 9] == [4, 4, 4, 2, 2, 2, 1, 1, 1]
    # steady steps: no second probe
    assert used[SKIP_STEPS + 9 :] == [2] * 30 and probe.chosen == 2
    probed_at = SKIP_STEPS + 9
    note = capsys.readouterr().err
    assert f"training on 2 of 4 CPU threads from step {probed_at}" in note
    assert "0.50 s at 2" in note
    # the other work ends: steps at 2 threads get faster, past DRIFT: the probe runs again
    quiet = {4: 0.2, 2: 0.3, 1: 0.9}
    start = probed_at + 30
    used = run_steps(probe, start, 6 + 9 + 5, quiet)
    # the median of the last RECENT steps moves once most of them are the faster ones
    flip = RECENT // 2 + 1
    assert used[:flip] == [2] * flip
    assert used[flip : flip + 9] == [4, 4, 4, 2, 2, 2, 1, 1, 1]
    assert used[flip + 9 :] == [4] * (20 - flip - 9) and probe.chosen == 4
    again = f"training on 4 of 4 CPU threads from step {start + flip + 9}"
    assert again in capsys.readouterr().err


def test_a_small_drift_does_not_probe_again(torch_threads):
    probe = ThreadProbe(2, steps_each=3)
    run_steps(probe, 0, SKIP_STEPS + 6, {2: 0.40, 1: 0.60})
    assert probe.chosen == 2
    used = run_steps(probe, SKIP_STEPS + 6, 60, {2: 0.40 * (1 + DRIFT * 0.9), 1: 0.60})
    assert used == [2] * 60


def test_fewer_threads_must_be_clearly_faster_and_one_core_never_probes(torch_threads, capsys):
    probe = ThreadProbe(2, steps_each=2)
    run_steps(probe, 0, SKIP_STEPS + 4 + 2, {2: 0.40, 1: 0.37})  # within the margin
    assert probe.chosen == 2 and capsys.readouterr().err == ""
    single = ThreadProbe(1)
    assert run_steps(single, 0, 12, {1: 0.3}) == [1] * 12


@pytest.mark.parametrize("value", ["many", 0, -2, 1.5, True])
def test_cpu_threads_takes_cores_measured_or_a_count(value):
    config = load_config("demo")
    assert config.cpu_threads == "measured"
    config.cpu_threads = value
    with pytest.raises(NearsightError, match="cpu_threads must be"):
        validate(config)
    config.cpu_threads = 3
    validate(config)
