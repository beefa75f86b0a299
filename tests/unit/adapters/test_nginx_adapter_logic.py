"""Pure logic of the Nginx adapter: rendering and parsing the upstream include file, settings
validation, and refusal of every name, address or path that could inject a config line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.nginx import NginxAdapter, NginxError, parse_upstream, render_upstream, worker_pids
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import WeightPlan

SERVERS = {"b1": "127.0.0.1:8081", "b2": "127.0.0.1:8082", "b3": "[::1]:8083"}

ADVERSARIAL_NAMES = ["up;stream", "up\nstream", "up stream", "up'x", 'up"x', "up/x", "up\\x", "$(reboot)", "u" * 64]
ADVERSARIAL_ADDRESSES = [
    "127.0.0.1:80; server 10.0.0.1:80",
    "127.0.0.1:80\n}",
    "evil host:80",
    "'127.0.0.1':80",
    "127.0.0.1/8:80",
    "127.0.0.1",
    "$(id):80",
    "127.0.0.1:0",
]


def test_render_writes_weights_down_and_dip_comments() -> None:
    text = render_upstream("klb", SERVERS, {"b1": 100, "b2": 0, "b3": 900}, method="least_conn", keepalive=8)
    lines = text.splitlines()
    assert lines[0].startswith("# written by knapsack-lb")
    assert "upstream klb {" in lines
    assert "    least_conn;" in lines
    assert "    server 127.0.0.1:8081 weight=100;  # b1" in lines
    assert "    server 127.0.0.1:8082 weight=1 down;  # b2" in lines
    assert "    server [::1]:8083 weight=900;  # b3" in lines
    assert "    keepalive 8;" in lines
    assert lines[-1] == "}"


def test_render_refuses_an_all_down_pool() -> None:
    with pytest.raises(NginxError, match="every server down"):
        render_upstream("klb", SERVERS, {"b1": 0, "b2": 0, "b3": 0})


def test_parse_round_trips_render() -> None:
    weights = {"b1": 7, "b2": 0, "b3": 993}
    assert parse_upstream(render_upstream("klb", SERVERS, weights), SERVERS) == weights


def test_parse_maps_lines_without_comment_by_address() -> None:
    text = "upstream klb {\n  server 127.0.0.1:8081 weight=3;\n  server 127.0.0.1:8082;\n  server [::1]:8083 down;\n}\n"
    assert parse_upstream(text, SERVERS) == {"b1": 3, "b2": 1, "b3": 0}


@pytest.mark.parametrize("bad", ADVERSARIAL_NAMES)
def test_render_refuses_adversarial_upstream_and_dip_names(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        render_upstream(bad, SERVERS, {"b1": 1})
    with pytest.raises(InvalidInputError):
        render_upstream("klb", {bad: "127.0.0.1:80"}, {bad: 1})


@pytest.mark.parametrize("bad", ADVERSARIAL_ADDRESSES)
def test_render_refuses_adversarial_addresses(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        render_upstream("klb", {"b1": bad}, {"b1": 1})


def _settings(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "include_file": str(tmp_path / "upstream.conf"),
        "config": str(tmp_path / "nginx.conf"),
        "upstream": "klb",
        "servers": dict(SERVERS),
        **extra,
    }


def test_from_config_defaults(tmp_path: Path) -> None:
    adapter = NginxAdapter.from_config(_settings(tmp_path))
    assert adapter.method == "round_robin" and adapter.resolution == 1000 and adapter.pid_file is None
    assert adapter.servers["b3"] == "[::1]:8083"


@pytest.mark.parametrize("bad", ADVERSARIAL_NAMES)
def test_from_config_refuses_adversarial_names(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        NginxAdapter.from_config(_settings(tmp_path, upstream=bad))
    assert info.value.field == "adapter.settings.upstream"
    with pytest.raises(InvalidInputError, match="servers"):
        NginxAdapter.from_config(_settings(tmp_path, servers={bad: "127.0.0.1:80"}))


@pytest.mark.parametrize("bad", ADVERSARIAL_ADDRESSES)
def test_from_config_refuses_adversarial_addresses(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        NginxAdapter.from_config(_settings(tmp_path, servers={"b1": bad}))
    assert info.value.field == "adapter.settings.servers.b1"


@pytest.mark.parametrize("key", ["include_file", "config", "pid_file", "prefix", "error_log"])
@pytest.mark.parametrize("bad", ["relative.conf", "/etc/nginx/x.conf;", "/tmp/a\nb", 42])
def test_from_config_refuses_bad_paths(tmp_path: Path, key: str, bad: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        NginxAdapter.from_config(_settings(tmp_path, **{key: bad}))
    assert info.value.field == f"adapter.settings.{key}"


@pytest.mark.parametrize(
    ("key", "value"),
    [("method", "ip_hash"), ("keepalive", -1), ("resolution", 0), ("reload_timeout", 0), ("servers", {}), ("x", 1)],
)
def test_from_config_names_the_bad_field(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(InvalidInputError, match=key if key != "x" else "unknown setting"):
        NginxAdapter.from_config(_settings(tmp_path, **{key: value}))


def test_plan_with_unknown_dip_writes_nothing(tmp_path: Path) -> None:
    adapter = NginxAdapter.from_config(_settings(tmp_path))
    result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "b9": 0.5}))
    assert not result.ok
    assert "b9" in result.reason
    assert not (tmp_path / "upstream.conf").exists()


def test_failed_nginx_test_restores_the_previous_file(tmp_path: Path) -> None:
    """With a main config Nginx rejects, ``nginx -t`` fails and the old include file is back."""
    include = tmp_path / "upstream.conf"
    old = render_upstream("klb", SERVERS, {"b1": 1, "b2": 1, "b3": 1})
    include.write_text(old)
    (tmp_path / "nginx.conf").write_text("this is not nginx configuration;\n")
    adapter = NginxAdapter.from_config(_settings(tmp_path, prefix=str(tmp_path), error_log=str(tmp_path / "e.log")))
    result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.2, "b2": 0.3, "b3": 0.5}))
    assert not result.ok
    assert "nginx -t failed" in result.reason and "restored" in result.reason
    assert include.read_text() == old
    assert adapter.read() == pytest.approx({"b1": 1 / 3, "b2": 1 / 3, "b3": 1 / 3})


def test_read_of_missing_file_is_empty_with_reason(tmp_path: Path) -> None:
    adapter = NginxAdapter.from_config(_settings(tmp_path))
    assert adapter.read() == {}
    assert "cannot read" in adapter.last_error


def test_worker_pids_sees_a_child_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert child.pid in worker_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert child.pid not in worker_pids(os.getpid())
