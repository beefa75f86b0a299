"""The relative circuit breaker (ELS blog)."""

from __future__ import annotations

from knapsack_lb.controller.breaker import RelativeCircuitBreaker
from knapsack_lb.controller.settings import CircuitBreakerSettings
from knapsack_lb.model import Measurement


def _m(dip: str, errors: int = 0, latency: float = 0.01, failure_latency: float | None = None) -> Measurement:
    ok = 100 - errors
    return Measurement("v", dip, 1.0, 0.1, 100, ok, errors, 0, latency if ok else None, latency, latency, latency,
                       failure_latency, "t")


def _breaker(**kw: float) -> RelativeCircuitBreaker:
    return RelativeCircuitBreaker(CircuitBreakerSettings(**kw))


def test_a_fast_failing_dip_is_ejected_even_though_its_errors_are_fast() -> None:
    b = _breaker()
    rounds = {d: _m(d) for d in "abcdefgh"} | {"x": _m("x", errors=90, latency=0.001, failure_latency=0.0005)}
    decision = b.evaluate(0.0, rounds, {d: 0.01 for d in rounds}, pool=9)
    assert decision.ejected == ("x",) and b.is_ejected("x")


def test_all_dips_equally_bad_trips_nothing() -> None:
    """The ELS example: every machine fails 25 % because of a shared dependency."""
    b = _breaker(error_rate_threshold=0.2)
    rounds = {d: _m(d, errors=25) for d in "abcd"}
    assert b.evaluate(0.0, rounds, {d: 0.01 for d in rounds}, pool=4).ejected == ()


def test_never_more_than_the_share_and_never_all() -> None:
    b = _breaker(max_ejected_share=0.3)
    rounds = {d: _m(d) for d in "abcdefg"} | {x: _m(x, errors=95) for x in "xyz"}
    decision = b.evaluate(0.0, rounds, {d: 0.01 for d in rounds}, pool=10)
    assert len(decision.ejected) == 3
    b2 = _breaker(max_ejected_share=0.9)
    two = {"a": _m("a"), "x": _m("x", errors=100)}
    assert len(b2.evaluate(0.0, two, {"a": 0.01, "x": 0.01}, pool=2).ejected) <= 1


def test_persistent_slowness_against_the_curve_ejects_after_the_configured_rounds() -> None:
    b = _breaker(latency_rounds=3)
    rounds = {d: _m(d) for d in "abcdef"} | {"s": _m("s", latency=0.2)}
    expected = {d: 0.01 for d in rounds}
    assert b.evaluate(0.0, rounds, expected, pool=7).ejected == ()
    assert b.evaluate(5.0, rounds, expected, pool=7).ejected == ()
    assert b.evaluate(10.0, rounds, expected, pool=7).ejected == ("s",)


def test_the_whole_pool_slow_is_not_a_bad_dip() -> None:
    b = _breaker(latency_rounds=1)
    rounds = {d: _m(d, latency=0.1) for d in "abcdef"}
    assert b.evaluate(0.0, rounds, {d: 0.01 for d in rounds}, pool=6).ejected == ()


def test_ejected_dips_return_after_the_ejection_time_which_doubles_on_repeat() -> None:
    b = _breaker(ejection_time=30.0)
    rounds = {d: _m(d) for d in "abcdefgh"} | {"x": _m("x", errors=100)}
    expected = {d: 0.01 for d in rounds}
    b.evaluate(0.0, rounds, expected, pool=9)
    assert b.evaluate(29.0, {}, expected, pool=9).returned == ()
    assert b.evaluate(30.0, {}, expected, pool=9).returned == ("x",)
    b.evaluate(31.0, rounds, expected, pool=9)
    assert b.ejections["x"].until == 31.0 + 60.0


def test_disabled_breaker_ejects_nothing() -> None:
    b = RelativeCircuitBreaker(CircuitBreakerSettings(enabled=False))
    rounds = {d: _m(d) for d in "abcdefgh"} | {"x": _m("x", errors=100)}
    assert b.evaluate(0.0, rounds, {d: 0.01 for d in rounds}, pool=9).ejected == ()


def test_a_dip_the_rest_cannot_do_without_is_kept_in() -> None:
    """An overloaded large DIP looks 'slow against its curve'; ejecting it would overload the rest."""
    rounds = {d: _m(d) for d in "abcdefgh"} | {"big": _m("big", latency=0.3)}
    expected = {d: 0.01 for d in rounds}
    small = {d: 0.1 for d in "abcdefgh"}
    b = _breaker(latency_rounds=1)
    decision = b.evaluate(0.0, rounds, expected, pool=9, capacity=small | {"big": 0.3})
    assert decision.ejected == () and "cannot carry the VIP" in decision.notes[0]
    roomy = _breaker(latency_rounds=1)
    assert roomy.evaluate(0.0, rounds, expected, pool=9, capacity={d: 0.15 for d in "abcdefgh"} | {"big": 0.3}
                          ).ejected == ("big",)
