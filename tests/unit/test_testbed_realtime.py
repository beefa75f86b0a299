"""Real-time scheduling helpers of the testbed: validation, refusal reasons, the policy's name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from knapsack_lb.lab.testbed.realtime import request_realtime, scheduler_name, validate_priority


@pytest.mark.parametrize("bad", [0, 100, -1, True, 5.0, "5"])
def test_priorities_outside_1_to_99_are_refused_by_value(bad: object) -> None:
    with pytest.raises(ValueError, match=f"realtime priority must be an integer in 1-99, got {bad!r}"):
        validate_priority(bad)  # type: ignore[arg-type]


def test_priorities_in_range_pass() -> None:
    assert validate_priority(1) == 1 and validate_priority(99) == 99


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
def test_an_ordinary_process_is_named_other() -> None:
    assert scheduler_name() == "other"


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
def test_request_realtime_either_switches_the_process_or_says_why() -> None:
    # In a child process, so the test runner itself never runs real-time.
    code = ("from knapsack_lb.lab.testbed.realtime import request_realtime, scheduler_name as n; "
            "r = request_realtime(3); print(n(), repr(r))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         check=True).stdout.split(" ", 1)
    policy, reason = out[0], out[1].strip()
    if policy == "fifo":
        assert reason == "None"
    else:
        assert policy == "other" and "refused" in reason


def test_request_realtime_validates_before_touching_the_process() -> None:
    with pytest.raises(ValueError, match="got 0"):
        request_realtime(0)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to drop privileges")
def test_an_unprivileged_process_is_refused_and_stays_ordinary() -> None:
    # The child imports as root, then drops to 'nobody' (and with it CAP_SYS_NICE) before asking.
    code = ("import os; from knapsack_lb.lab.testbed.realtime import request_realtime, scheduler_name as n; "
            "os.setgroups([]); os.setgid(65534); os.setuid(65534); "
            "r = request_realtime(3); print(n()); print(r)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    policy, reason = result.stdout.splitlines()
    assert policy == "other"
    assert reason.startswith("sched_setscheduler(SCHED_FIFO, 3) refused:")
