"""Pure pieces of the demo: settings validation, per-phase metrics, improvements, report and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.demo.loadgen import LoadSpec, _parse_head
from knapsack_lb.lab.demo.report import (
    build_report,
    improvement,
    phase_metrics,
    plot_report,
    summary_lines,
    write_report,
)
from knapsack_lb.lab.demo.settings import DemoSettings, probe_spec


def test_settings_rates_and_probe_share() -> None:
    s = DemoSettings()
    assert s.total_capacity == pytest.approx(4.8 / 0.02)
    assert s.request_rate == pytest.approx(0.7 * 240)
    assert s.probe_load_share == pytest.approx(6 * 5 / 2 / 240)
    quick = DemoSettings.quick_preset(seed=7)
    assert quick.quick and quick.seed == 7 and quick.phase_seconds < s.phase_seconds
    # light requests are 1 % of a request's work each, and the VIP names the emulators' light URL only with them
    light = DemoSettings(light_requests=50)
    assert light.probe_load_share == pytest.approx(6 * (5 + 50 * 0.01) / 2 / 240)
    assert "light_path" not in probe_spec(s, timeout=2.0)
    assert probe_spec(light, timeout=2.0) == {"path": "/probe", "requests_per_round": 5, "interval": 2.0,
                                              "timeout": 2.0, "light_path": "/light", "light_requests_per_round": 50}


@pytest.mark.parametrize("field,value", [("load", 1.2), ("connections", 0), ("capacities", (1.0,)),
                                         ("distribution", "uniform"), ("warmup_seconds", 100.0),
                                         ("light_requests", -1)])
def test_settings_reject_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        DemoSettings(**{field: value})  # type: ignore[arg-type]
    assert field in str(info.value)


def test_load_spec_is_bounded() -> None:
    spec = LoadSpec("127.0.0.1", 80, rate=100, connections=10, lifetime=5, duration=10)
    assert spec.request_budget == 3 * 100 * 10 + 1000
    with pytest.raises(ValueError, match="duration"):
        LoadSpec("127.0.0.1", 80, rate=100, connections=10, lifetime=5, duration=10, count_after=10)


def test_parse_response_head() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Backend: dip-2\r\n\r\n"
    assert _parse_head(head) == (200, "dip-2", 3)


def _samples() -> dict[str, object]:
    return {"latency": [0.1, 0.2, 0.3, 5.0], "status": [200, 200, 200, 503], "backend": ["a", "a", "b", "b"],
            "connections": {"a": 2, "b": 1}, "errors": 1}


def test_phase_metrics() -> None:
    stats = {"a": {"busy_seconds": 5.0}, "b": {"busy_seconds": 2.5}}
    m = phase_metrics(_samples(), stats, 10.0, {"a": 0.6, "b": 0.4}, ["a", "b"])
    assert m["requests"] == 3 and m["failed"] == 2  # one 503 and one never answered
    assert m["mean"] == pytest.approx(0.2)
    assert m["per_dip"]["a"]["share"] == pytest.approx(2 / 3)
    assert m["per_dip"]["a"]["utilisation"] == pytest.approx(0.5)
    assert m["per_dip"]["b"]["mean_latency"] == pytest.approx(0.3)
    assert m["per_dip"]["b"]["weight"] == pytest.approx(0.4)


def test_improvement_and_report(tmp_path: Path) -> None:
    assert improvement(0.4, 0.1) == pytest.approx(0.75)
    assert improvement(None, 0.1) is None and improvement(0.0, 0.1) is None
    metrics = phase_metrics(_samples(), {}, 10.0, {}, ["a", "b"])
    slower = dict(metrics, mean=0.4)
    report = build_report({"capacities": [1.0, 0.5]}, {"roundrobin": slower, "leastconn": slower,
                                                       "knapsacklb": metrics}, {"a": 0.7, "b": 0.3}, {})
    assert report["improvement_vs_roundrobin"] == pytest.approx(0.5)
    assert report["improvement_vs_leastconn"] == pytest.approx(0.5)
    path = write_report(report, tmp_path)
    assert json.loads(path.read_text())["learned_weights"] == {"a": 0.7, "b": 0.3}
    report["settings"]["capacities"] = [1.0, 0.5]
    report["phases"] = {k: dict(v, per_dip={"dip-1": v["per_dip"]["a"], "dip-2": v["per_dip"]["b"]})
                        for k, v in report["phases"].items()}
    png = plot_report(report, {"roundrobin": [0.1, 0.2], "knapsacklb": [0.05, 0.1]}, tmp_path / "demo.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_summary_names_the_weights_in_force_beside_the_last_plan() -> None:
    metrics = phase_metrics(_samples(), {}, 10.0, {}, ["a", "b"])
    counted = dict(metrics, mean_weights={"a": 0.55, "b": 0.45})
    report = build_report({}, {"roundrobin": dict(metrics, mean=0.4), "knapsacklb": counted}, {"a": 0.7, "b": 0.3}, {})
    lines = summary_lines(report)
    assert "learned weights (the plan at the end of its phase): a 0.700, b 0.300" in lines
    assert "weights in force while counted (mean): a 0.550, b 0.450" in lines
    without = build_report({}, {"knapsacklb": metrics}, {"a": 0.7, "b": 0.3}, {})
    assert not any(line.startswith("weights in force") for line in summary_lines(without))


def test_live_view_on_a_terminal_and_plain() -> None:
    import io

    from rich.console import Console

    from knapsack_lb.lab.demo.live import LiveView

    tty = Console(file=io.StringIO(), force_terminal=True, width=100)
    with LiveView(tty, ["dip-1", "dip-2"]) as view:
        assert view.interactive
        view.update("roundrobin", 10, {"dip-1": 0.5}, {"dip-1": (3, 0.1)}, "warm-up")
    assert "HAProxy weight" in tty.file.getvalue()  # type: ignore[attr-defined]

    plain = Console(file=io.StringIO(), force_terminal=False, width=200)
    with LiveView(plain, ["dip-1", "dip-2"], plain_every=0.0) as view:
        assert not view.interactive
        view.update("roundrobin", 10, {"dip-1": 0.5}, {"dip-1": (3, 0.1)})
    line = plain.file.getvalue()  # type: ignore[attr-defined]
    assert "[roundrobin]" in line and "dip-1=w0.50/100ms" in line and "dip-2=w0.00/-" in line
