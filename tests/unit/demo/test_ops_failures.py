"""How the day-2 tour accounts for what went wrong in a step: HAProxy's counters and the clients'."""

from __future__ import annotations

from knapsack_lb.lab.demo.ops import StepRecord, _counter_growth, _what_failed


def test_counter_growth_keeps_only_counters_that_grew() -> None:
    before = {"dip-1": {"wredis": 2, "econ": 0}, "dip-2": {"wredis": 0}}
    after = {"dip-1": {"wredis": 2, "econ": 1}, "dip-2": {"wredis": 5}, "dip-3": {"econ": 0}}
    assert _counter_growth(before, after) == {"dip-1": {"econ": 1}, "dip-2": {"wredis": 5}}


def test_counter_growth_after_a_reload_takes_the_new_count() -> None:
    assert _counter_growth({"dip-1": {"wredis": 40}}, {"dip-1": {"wredis": 3}}) == {"dip-1": {"wredis": 3}}


def test_what_failed_names_the_kinds_and_the_servers() -> None:
    record = StepRecord("drain", "PUT /dips/dip-2/drain", 0.0)
    assert _what_failed(record) == ""
    record.extra.update(failures={"timed out": 7, "unanswered": 0, "HTTP 502": 1},
                        haproxy_errors={"dip-3": {"wretr": 3, "wredis": 3}})
    assert _what_failed(record) == "; failures: 7 timed out; 1 HTTP 502; HAProxy dip-3: wretr 3, wredis 3"
