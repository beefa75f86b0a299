"""Light probes against a real emulated DIP over loopback: the waits seen through the network read
the DIP's load (a behaviour test on one short case; the accuracy table is the bench's)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from knapsack_lb.cli.main import app
from knapsack_lb.controller.waiting import erlang_c
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.bench.light_probes_live import LiveLightCase, run_live_case


@pytest.mark.usefixtures("kernel_stamping")
def test_live_light_probes_behind_busy_workers_wait_as_erlang_says_and_read_the_load() -> None:
    case = LiveLightCase("fcfs", 4, 0.85)
    result = run_live_case(case, seconds=8.0, seed=2)
    assert result["probes"] > 150, result
    assert 0 < result["idle_median"] <= result["idle_ceiling"] < result["idle_median"] + 0.005
    truth = result["true_utilisation"]
    assert 0.75 < truth < 0.97, result  # the client offered 85 %, the probes add 1 %
    # A probe behind four busy workers waits a service time, far above the loopback's jitter.
    assert abs(result["waited_share"] - erlang_c(4, 4 * truth)) < 0.15, result
    assert 0.8 < result["capacity_with_rate_over_truth"] < 1.2, result
    assert result["utilisation_low"] <= result["utilisation_read"] <= result["utilisation_high"], result
    # Without the rate the read errs on the safe side: jitter counted as waits, and arrivals that
    # bunch when the machine is busy (longer waits than Poisson's), both read a busier DIP.
    assert -0.05 < result["utilisation_read"] - truth < 0.15, result
    # counted only past the jitter line, with the waits below it restored: the same load
    assert 0 < result["past_jitter_line"] <= result["waited"], result
    assert -0.05 < result["utilisation_read_past_line"] - truth < 0.15, result


@pytest.mark.parametrize(("case", "seconds", "field"), [
    (LiveLightCase("fcfs", 0, 0.5), 5.0, "workers"),
    (LiveLightCase("fcfs", 4, 1.2), 5.0, "utilisation"),
    (LiveLightCase("lifo", 4, 0.5), 5.0, "mode"),  # type: ignore[arg-type]
    (LiveLightCase("ps", 4, 0.5), 0.0, "seconds"),
    (LiveLightCase("ps", 4, 0.5, light_work=0.0), 5.0, "light_work"),
    (LiveLightCase("ps", 4, 0.5, light_work=float("nan")), 5.0, "light_work"),
])
def test_bad_live_input_names_the_field_before_starting_anything(case: LiveLightCase, seconds: float,
                                                                 field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        run_live_case(case, seconds=seconds)
    assert info.value.field == field


def test_the_command_refuses_bad_live_seconds_naming_the_field() -> None:
    result = CliRunner().invoke(app, ["bench", "light-probes", "--live", "--seconds", "0"])
    assert result.exit_code == 2 and "'seconds'" in result.output


def test_probing_a_dip_that_never_answers_stops_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import socket
    import time

    from knapsack_lb.lab.bench import light_probes_live

    monkeypatch.setattr(light_probes_live, "ANSWER_GRACE", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        answered = asyncio.run(light_probes_live._probe_at([0.0, 0.01, 0.02], port, 2))
        assert answered == [] and time.monotonic() - started < 3.0
