"""Scenario files: shipped ones load; bad input names the field and the value."""

from __future__ import annotations

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.spec import load_scenario, parse_scenario, shipped_scenarios


def test_shipped_scenarios_load_and_validate() -> None:
    names = shipped_scenarios()
    for expected in ("knapsack-paper30", "knapsack-3dip", "knapsack-dynamics", "l7-basics"):
        assert expected in names
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name and sc.dip_names() and sc.policies


def test_paper30_is_table_3() -> None:
    sc = load_scenario("knapsack-paper30")
    cores = [g.workers for g in sc.dip_groups()]
    assert len(cores) == 30 and cores.count(1) == 16 and cores.count(2) == 8 and cores.count(4) == 4
    assert cores.count(8) == 2 and sc.lb.layer == 4 and sc.lb.instances > 1


def test_errors_name_the_field_and_value() -> None:
    good = {"dips": [{"name": "a"}], "clients": {"kind": "open", "rate": 1}}
    with pytest.raises(InvalidInputError, match=r"dips\.0\.workers.*-1"):
        parse_scenario({**good, "dips": [{"name": "a", "workers": -1}]})
    with pytest.raises(InvalidInputError, match="bogus"):
        parse_scenario({**good, "bogus": 1})
    with pytest.raises(InvalidInputError, match="unknown DIP 'zz'"):
        parse_scenario({**good, "events": [{"at": 1, "kind": "fail", "dips": ["zz"]}]})
    with pytest.raises(InvalidInputError, match="needs field 'speed'"):
        parse_scenario({**good, "events": [{"at": 1, "kind": "capacity", "dips": ["a"]}]})
    with pytest.raises(InvalidInputError, match="layer 4"):
        parse_scenario({**good, "lb": {"layer": 4}})
    with pytest.raises(InvalidInputError, match="scenario"):
        load_scenario("no-such-scenario")


def test_yaml_on_key_is_read_as_retry_statuses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text("dips: [{name: a}]\nclients: {rate: 1}\nlb: {retries: {max_attempts: 2, on: [rejected]}}\n")
    assert load_scenario(str(path)).lb.retries.on == ("rejected",)


def test_group_names_select_whole_groups() -> None:
    sc = parse_scenario({"dips": [{"name": "a", "count": 3}, {"name": "b"}], "clients": {"rate": 1}})
    assert sc.dip_names() == ["a-1", "a-2", "a-3", "b"]
    assert sc.resolve(("a",)) == [0, 1, 2] and sc.resolve(("b", 1)) == [1, 3]
