"""`klb demo --ops` end to end: the day-2 tour on the live testbed (real HAProxy, Redis, emulated
DIPs, the admin API over HTTP) with a client under load. Each step's own check must hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from knapsack_lb.cli.main import app


@pytest.mark.timeout(600)
def test_the_day2_tour_hurts_no_live_traffic(tmp_path: Path, artifacts_dir: Path) -> None:
    out = tmp_path / "ops"
    result = CliRunner().invoke(app, ["demo", "--ops", "--quick", "--out", str(out)])
    report = json.loads((out / "ops-report.json").read_text())
    steps = {step["key"]: step for step in report["steps"]}
    failing = {k: s["check"] for k, s in steps.items() if s["passed"] is False}
    assert result.exit_code == 0 and report["passed"], (failing, result.output[-3000:])
    assert list(steps) == ["baseline", "learn-stop", "learn", "steady", "add", "drain", "undrain", "fail", "recover",
                           "remove", "dry-run", "dry-run-off", "stop", "restart"]
    for key, step in steps.items():  # zero failed requests outside the killed DIP's own
        assert key == "fail" or step["failed"] == 0, (key, step["check"])
    assert steps["learn"]["extra"]["solved_after"] is not None
    assert steps["add"]["max_utilisation"]["dip-5"] < 1.0
    assert report["plans"] and all(plan["reasons"] for plan in report["plans"])  # what klb did, and why
    # the curves are written as a set: the removed DIP leaves none behind, the DIPs still in the VIP keep theirs
    assert set(report["curves"]) == {"dip-1", "dip-2", "dip-3", "dip-5"}
    (artifacts_dir / "ops.png").write_bytes((out / "ops.png").read_bytes())
