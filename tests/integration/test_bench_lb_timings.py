"""``klb bench lb-timings`` on the live testbed (real HAProxy, Redis, emulated DIPs, klb's probe worker
and controller), shortened: both variants run their whole time under load and end on a plan klb learned.
What each variant's learning costs the clients is the bench's to measure, not this test's to assert."""

from __future__ import annotations

from pathlib import Path

import pytest

from knapsack_lb.lab.bench.lb_timings import run_pairs

pytestmark = pytest.mark.timeout(240)


def test_both_variants_run_under_load_and_end_on_a_learned_plan(tmp_path: Path) -> None:
    runs = run_pairs([4], seconds=25.0, count_after=5.0, workdir=tmp_path)
    assert [r.logs for r in runs] == [True, False]
    for run in runs:
        assert run.requests > 1000 and run.failed < run.requests / 10 and run.mean_ms is not None
        assert run.probe_requests > 0 and run.budget
        assert run.plan_method in ("exact-greedy", "capacity-proportional") and len(run.plan) == 6, run
