"""PowerDNS adapter logic without PowerDNS: Lua rendering and parsing, strict names,
injection attempts, settings, and an unreachable API."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.base import load_adapter_class
from adapters.dns import (
    PowerDnsAdapter,
    PowerDnsError,
    PowerDnsSettings,
    parse_lua,
    render_lua,
    rrset_patch,
    validate_dns_name,
    validate_ip,
)
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.procs import free_port
from knapsack_lb.model import WeightPlan

ADDRESSES = {"b1": "127.0.0.10", "b2": "127.0.0.11", "b3": "127.0.0.12"}
INJECTIONS = [
    "'),os.execute('x",
    "127.0.0.1'},{1,'10.0.0.1",
    '127.0.0.1")os.exit("',
    "127.0.0.1;rm",
    "127.0.0.1 ",
    "127.0.0.1\n",
    "127.0.0.1:53",
    "[::1]",
    "fe80::1%eth0",
    "example.com",
    "",
]
BAD_NAMES = ["a;b.test.", "a\nb.test.", "a b.test.", 'a"b.test.', "a'b.test.", "a/b.test.", "a_b.test.",
             "*.test.", "a..test.", "'),os.execute('x", "127.0.0.1", "", "."]  # fmt: skip


def raw(**extra: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "api_url": "http://127.0.0.1:8081",
        "api_key": "s3cret-key",
        "zone": "klb.test.",
        "record": "vip",
        "addresses": dict(ADDRESSES),
        "dns_server": "127.0.0.1:5300",
    }
    settings.update(extra)
    return settings


def test_render_and_parse_round_trip_leaving_zero_out() -> None:
    content = render_lua("A", ADDRESSES, {"b1": 100, "b2": 0, "b3": 900})
    assert content == "A \"pickwrandom({{100,'127.0.0.10'},{900,'127.0.0.12'}})\""
    assert parse_lua(content) == ("A", {"127.0.0.10": 100, "127.0.0.12": 900})


def test_ipv6_renders_aaaa_in_canonical_form() -> None:
    content = render_lua("AAAA", {"b1": "2001:db8:0::1"}, {"b1": 5})
    assert content == "AAAA \"pickwrandom({{5,'2001:db8::1'}})\""
    assert parse_lua(content) == ("AAAA", {"2001:db8::1": 5})


def test_all_zero_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="SERVFAIL"):
        render_lua("A", ADDRESSES, {"b1": 0, "b2": 0, "b3": 0})


@pytest.mark.parametrize("weight", [-1, 1.5, True, "3"])
def test_weights_must_be_non_negative_integers(weight: Any) -> None:
    with pytest.raises(InvalidInputError, match="integer"):
        render_lua("A", ADDRESSES, {"b1": weight})


@pytest.mark.parametrize("address", INJECTIONS)
def test_lua_injection_through_addresses_is_refused(address: str) -> None:
    with pytest.raises(InvalidInputError, match="IP address"):
        render_lua("A", {"b1": address}, {"b1": 1})
    with pytest.raises(InvalidInputError, match="addresses"):
        PowerDnsSettings.parse(raw(addresses={"b1": address}))


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_zone_and_record_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInputError, match="zone"):
        PowerDnsSettings.parse(raw(zone=name))
    if name != "127.0.0.1":  # relative "127.0.0.1" is the valid name 127.0.0.1.klb.test.
        with pytest.raises(InvalidInputError, match="record"):
            PowerDnsSettings.parse(raw(record=name))


@pytest.mark.parametrize("dip", ["b;1", "b 1", "b'1", "b/1", "b\n1", "'),os.execute('x", ""])
def test_bad_dip_names_are_refused(dip: str) -> None:
    with pytest.raises(InvalidInputError, match="addresses"):
        PowerDnsSettings.parse(raw(addresses={dip: "127.0.0.1"}))


def test_parse_refuses_content_it_did_not_write() -> None:
    for content in [
        "A \"return '127.0.0.1'\"",
        "A \"pickwrandom({{1,'127.0.0.1'}}) os.execute('x')\"",
        "A \"pickwrandom({{1,'127.0.0.1'},{2,'x'}})\"",
        "A \"pickrandom({'127.0.0.1'})\"",
    ]:
        with pytest.raises(PowerDnsError, match="pickwrandom"):
            parse_lua(content)


def test_names_are_normalised() -> None:
    assert validate_dns_name("zone", "KLB.Test") == "klb.test."
    assert validate_ip("a", "2001:DB8::0:1") == "2001:db8::1"
    settings = PowerDnsSettings.parse(raw(record="www"))
    assert settings.record == "www.klb.test." and settings.ttl == 5 and settings.rrtype == "A"
    assert PowerDnsSettings.parse(raw(record="WWW.klb.test.")).record == "www.klb.test."


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("record", "www.other.test.", "record"),
        ("addresses", {"b1": "127.0.0.1", "b2": "::1"}, "addresses"),
        ("addresses", {"b1": "127.0.0.1", "b2": "127.0.0.1"}, "addresses"),
        ("api_url", "http://127.0.0.1:8081/api/v1", "api_url"),
        ("api_url", "http://user:pw@127.0.0.1:8081", "api_url"),
        ("api_url", "ftp://127.0.0.1", "api_url"),
        ("api_url", "http://bad host:1", "api_url"),
        ("dns_server", "localhost:53", "dns_server"),
        ("dns_server", "127.0.0.1", "dns_server"),
        ("ttl", -1, "ttl"),
        ("ttl", "5", "ttl"),
        ("resolution", 0, "resolution"),
        ("verify_queries", 0, "verify_queries"),
        ("timeout", 0, "timeout"),
        ("server_id", "local host", "server_id"),
        ("colour", "blue", "adapter.settings"),
    ],
)
def test_bad_settings_name_the_field(key: str, value: object, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        PowerDnsSettings.parse(raw(**{key: value}))
    assert field in info.value.field


def test_an_adapter_needs_addresses() -> None:
    with pytest.raises(InvalidInputError) as info:
        PowerDnsAdapter.from_config(raw(addresses={}))
    assert info.value.field == "adapter.settings.addresses"


@pytest.mark.parametrize("key", ["with space", "new\nline", "", "x" * 300])
def test_bad_api_keys_are_refused_without_echoing_them(key: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        PowerDnsSettings.parse(raw(api_key=key))
    assert info.value.value == "<hidden>"
    assert key not in str(info.value) or not key


def test_api_key_from_the_environment() -> None:
    settings = raw()
    del settings["api_key"]
    settings["api_key_env"] = "KLB_PDNS_KEY"
    parsed = PowerDnsSettings.parse(settings)  # validating settings reads no environment variable
    assert parsed.api_key_from({"KLB_PDNS_KEY": "abc"}) == "abc"
    with pytest.raises(InvalidInputError, match="not set"):
        parsed.api_key_from({})
    with pytest.raises(InvalidInputError, match="not set"):
        PowerDnsAdapter.from_config(settings, environ={})


def test_rrset_patch_bodies() -> None:
    body = rrset_patch("vip.klb.test.", "A", 5, "A \"pickwrandom({{1,'127.0.0.1'}})\"")
    assert body["rrsets"][0] == {
        "name": "vip.klb.test.",
        "type": "LUA",
        "changetype": "REPLACE",
        "ttl": 5,
        "records": [{"content": "A \"pickwrandom({{1,'127.0.0.1'}})\"", "disabled": False}],
    }
    assert rrset_patch("vip.klb.test.", "A", 5, None)["rrsets"][0]["changetype"] == "DELETE"


def test_entry_points_find_the_adapter() -> None:
    assert load_adapter_class("powerdns") is PowerDnsAdapter
    assert load_adapter_class("dns") is PowerDnsAdapter


def test_unreachable_api_is_a_failed_result_not_an_exception() -> None:
    adapter = PowerDnsAdapter.from_config(raw(api_url=f"http://127.0.0.1:{free_port()}", timeout=0.5))
    try:
        result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "b2": 0.5}))
        assert not result.ok and "unreachable" in result.reason
        assert result.lb_weights == {"b1": 500, "b2": 500}
        assert adapter.read() == {}
        assert "unreachable" in adapter.last_error
        assert not adapter.check().ok
    finally:
        adapter.close()


def test_a_plan_with_an_unknown_dip_fails_before_any_call() -> None:
    adapter = PowerDnsAdapter.from_config(raw(api_url=f"http://127.0.0.1:{free_port()}"))
    try:
        result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "nope": 0.5}))
        assert not result.ok and "nope" in result.reason
    finally:
        adapter.close()
