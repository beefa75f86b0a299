"""The claims registry: modules found, rows well-formed, a missing module reported as a row."""

from __future__ import annotations

from knapsack_lb.sim import reproduce
from knapsack_lb.sim.reproduce import ClaimRow, Experiment, experiments, percent_lower, run_claims


def test_every_document_has_experiments() -> None:
    docs = {item.document for item in experiments() if isinstance(item, Experiment)}
    assert {"knapsack", "l7", "bloc", "dl3", "els"} <= docs


def test_l7_sticky_claim_runs_and_holds() -> None:
    sticky = [e for e in experiments("l7") if isinstance(e, Experiment) and e.name == "sticky sessions"]
    rows = sticky[0].run(1)
    assert len(rows) == 1 and rows[0].holds and "expired" in rows[0].simulated_value


def test_missing_claims_module_is_a_row_that_does_not_hold(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(reproduce, "CLAIM_MODULES", ("knapsack_lb.sim.claims.nothing",))
    rows = run_claims()
    assert rows == [
        ClaimRow(
            "nothing",
            "claims module not written yet",
            "-",
            "-",
            "-",
            False,
            note="knapsack_lb.sim.claims.nothing does not exist",
        )
    ]


def test_percent_lower() -> None:
    assert percent_lower(55.0, 100.0) == 45.0
    assert percent_lower(120.0, 100.0) == -20.0
    assert percent_lower(1.0, 0.0) == 0.0
