"""Real-time scheduling for the testbed's instruments: emulated backends that must keep their latency.

An emulated DIP (:mod:`knapsack_lb.lab.testbed.emulator`) is only a yardstick if it answers
after the service time it was given. On a busy machine an ordinary (``SCHED_OTHER``)
process is woken late: with four other processes alternating 0.2-3 ms of CPU and
0.1-3 ms of sleep on the two cores of the development VM, 17 % of a 2 ms emulator's
departures woke after their due time even with a 0.5 ms busy-wait lead, and its mean
server-side latency was 6.9 % too long (``klb bench probes``). A ``nice -20`` made no
difference (the fair scheduler still lets the running task finish its slice), and neither
did a 1 ns timer slack (``PR_SET_TIMERSLACK``). ``SCHED_FIFO`` does: a woken real-time
task preempts ordinary ones at once and has no timer slack; the same run gave 0.5 %
(4 % of the departures late).

:func:`request_realtime` asks for ``SCHED_FIFO`` at a given priority for the calling
process (``sched_setscheduler(2)``).

How it fails: it needs ``CAP_SYS_NICE`` (root has it, a container may not) and a POSIX
platform; without either it changes nothing and returns why, and the caller goes on with
ordinary scheduling (the emulator says so on stderr and in ``/stats``). A real-time
process that keeps a core busy starves ordinary ones on that core; Linux's real-time
throttling (``/proc/sys/kernel/sched_rt_runtime_us``, 95 % of each second by default)
leaves them the rest. An emulator only busy-waits up to its spin limit per departure, so
real-time priority suits light, latency-critical instruments (the probe benchmark's
accuracy phases: a DIP or two, one request at a time each), not an emulator under heavy
load.
"""

from __future__ import annotations

import os

MIN_PRIORITY = 1
MAX_PRIORITY = 99  # SCHED_FIFO priorities on Linux

_POLICY_NAMES = {
    getattr(os, name): label
    for name, label in (("SCHED_OTHER", "other"), ("SCHED_FIFO", "fifo"), ("SCHED_RR", "rr"),
                        ("SCHED_BATCH", "batch"), ("SCHED_IDLE", "idle"))
    if hasattr(os, name)
}


def validate_priority(priority: int) -> int:
    """Return ``priority`` if it is a ``SCHED_FIFO`` priority (1-99), else raise ``ValueError`` naming it."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"realtime priority must be an integer in {MIN_PRIORITY}-{MAX_PRIORITY}, got {priority!r}")
    return priority


def request_realtime(priority: int) -> str | None:
    """Switch the calling process to ``SCHED_FIFO`` at ``priority``; None on success, else the reason it was refused."""
    validate_priority(priority)
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_FIFO"):
        return "this platform has no sched_setscheduler/SCHED_FIFO"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as refused:  # EPERM without CAP_SYS_NICE; EINVAL on an odd kernel
        return f"sched_setscheduler(SCHED_FIFO, {priority}) refused: {refused.strerror or refused}"
    return None


def scheduler_name(pid: int = 0) -> str:
    """The scheduling policy of process ``pid`` (0: this one) as the kernel reports it: fifo, rr, other, ..."""
    if not hasattr(os, "sched_getscheduler"):
        return "unknown"
    policy = os.sched_getscheduler(pid)
    return _POLICY_NAMES.get(policy & ~getattr(os, "SCHED_RESET_ON_FORK", 0), f"policy-{policy}")
