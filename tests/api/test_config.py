"""The configuration file: the example loads, the reference doc lists every field, errors name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from knapsack_lb.config import (
    ConfigError,
    KlbConfig,
    iter_fields,
    load_config,
    parse_config,
    reference_markdown,
    require_safe_listen,
)
from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "configuration.md"
EXAMPLE = REPO_ROOT / "examples" / "config.yaml"


def test_example_config_loads_with_its_vip_and_adapter() -> None:
    config = load_config(EXAMPLE)
    assert [v.name for v in config.vips] == ["web"]
    assert [d.name for d in config.vips[0].dips] == ["dip1", "dip2", "dip3"]
    assert config.vips[0].adapter.lb == "web-haproxy"
    assert config.load_balancers["web-haproxy"].adapter == "haproxy"
    assert config.api.host == "127.0.0.1"
    assert config.controller.loop.interval == 5.0


def test_reference_doc_lists_every_field_with_its_default() -> None:
    """Regenerate with `klb config-reference -o docs/configuration.md` when this fails."""
    text = DOC.read_text()
    fields = list(iter_fields(KlbConfig))
    assert len(fields) > 60  # nested controller, probe and adapter fields are all there
    missing = [path for path, _t, default, _d in fields if f"| `{path}` | " not in text]
    assert missing == []
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
    wrong_default = [path for path, _t, default, _d in fields if f"| `{default}` |" not in rows[path]]
    assert wrong_default == []
    assert reference_markdown().count("\n| `") == len(fields)


def test_every_config_field_has_a_description() -> None:
    undocumented = [path for path, _type, _default, description in iter_fields(KlbConfig) if not description]
    assert undocumented == []


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        ({"vips": [{"name": "web", "dips": [{"name": "a", "address": "127.0.0.1"}]}]}, "vips.0.dips.0.address",
         "127.0.0.1"),
        ({"vips": [{"name": "bad;name"}]}, "vips.0.name", "bad;name"),
        ({"api": {"port": 70000}}, "api.port", 70000),
        ({"api": {"host": "localhost:80"}}, "api.host", "localhost:80"),
        ({"controller": {"loop": {"interval": -1}}}, "controller.loop.interval", -1),
        ({"redis": {"url": "http://x"}}, "redis.url", "http://x"),
        ({"redis": {"cluster": "maybe"}}, "redis.cluster", "maybe"),
        ({"redis": {"startup_nodes": ["10.0.0.2:7000"]}}, "redis.startup_nodes", ["10.0.0.2:7000"]),
        ({"redis": {"cluster": True, "startup_nodes": ["10.0.0.2:7000", "10.0.0.3"]}}, "redis.startup_nodes.1",
         "10.0.0.3"),
        ({"redis": {"cluster": True, "startup_nodes": ["10.0.0.2:99999"]}}, "redis.startup_nodes.0",
         "10.0.0.2:99999"),
        ({"redis": {"cluster": True, "url": "redis://10.0.0.1:7000/2"}}, "redis.url", "redis://10.0.0.1:7000/2"),
        ({"redis": {"cluster": True, "url": "unix:///run/redis.sock"}}, "redis.url", "unix:///run/redis.sock"),
        ({"logging": {"level": "LOUD"}}, "logging.level", "LOUD"),
        ({"surprise": 1}, "surprise", 1),
    ],
)
def test_errors_name_the_field_and_value(raw: dict[str, object], field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.field == field
    assert info.value.value == value
    assert field in str(info.value)


def test_a_redis_cluster_with_startup_nodes_is_accepted() -> None:
    config = parse_config({"redis": {"url": "redis://10.0.0.1:7000", "cluster": True,
                                     "startup_nodes": ["10.0.0.2:7000", "[fd00::3]:7000"]}})
    assert config.redis.cluster
    assert config.redis.startup_node_addresses() == (("10.0.0.2", 7000), ("fd00::3", 7000))
    assert not parse_config({}).redis.cluster


def test_a_controller_setting_by_its_old_flat_name_says_where_it_moved() -> None:
    with pytest.raises(ConfigError, match=r"'drain_time' is now 'drain.time'.*'safety' is now 'rails'"):
        parse_config({"controller": {"drain_time": 5.0, "safety": {"min_weight": 0.0}}})


def test_duplicate_vips_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate VIP names"):
        parse_config({"vips": [{"name": "a"}, {"name": "a"}]})


def test_unreadable_and_invalid_yaml_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("vips: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_token_sources_in_order(tmp_path: Path) -> None:
    secret = "s3cret-token-0123456789"
    assert parse_config({"api": {"token": secret}}).api.resolve_token({}) == secret
    file = tmp_path / "token"
    file.write_text(secret + "\n")
    assert parse_config({"api": {"token_file": str(file)}}).api.resolve_token({}) == secret
    assert parse_config({"api": {"token_env": "MY_TOKEN"}}).api.resolve_token({"MY_TOKEN": secret}) == secret
    assert parse_config({}).api.resolve_token({}) is None
    with pytest.raises(ConfigError, match="at least 16"):
        parse_config({"api": {"token": "short"}}).api.resolve_token({})
    with pytest.raises(ConfigError, match="token_file"):
        parse_config({"api": {"token_file": str(tmp_path / "missing")}}).api.resolve_token({})
    with pytest.raises(ConfigError, match="not both"):
        parse_config({"api": {"token": secret, "token_file": str(file)}})


def test_non_loopback_listen_needs_a_token() -> None:
    require_safe_listen("127.0.0.1", None)
    require_safe_listen("::1", None)
    require_safe_listen("0.0.0.0", "a-token-of-enough-length")
    with pytest.raises(ConfigError) as info:
        require_safe_listen("0.0.0.0", None)
    assert info.value.field == "api.host"


DEFAULT_CLAIM = re.compile(
    r"`(?P<path>[a-z_]+(?:\.[a-z_]+)+)`[^.`\n]{0,60}?\bdefault(?:s to| is|:)?\s+`?(?P<value>-?\d[\d_]*(?:\.\d+)?)"
)


def _number(text: str) -> float | None:
    try:
        return float(text.strip("'\"").replace("_", ""))
    except ValueError:
        return None


def test_the_readme_and_docs_state_the_defaults_the_reference_has() -> None:
    """One source of truth: the README links the generated reference, and wherever a page names a
    setting's default (``\\`loop.interval\\` ... default 5``) it is the code's default."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert "(docs/configuration.md)" in readme
    defaults = {path: _number(default) for path, _t, default, _d in iter_fields(KlbConfig)}
    by_leaf: dict[str, set[float | None]] = {}
    for path, value in defaults.items():
        for cut in range(1, path.count(".") + 1):
            by_leaf.setdefault(path.split(".", cut)[-1], set()).add(value)
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    claims, wrong = 0, []
    for page in pages:
        if page.name == "configuration.md":
            continue
        for match in DEFAULT_CLAIM.finditer(page.read_text()):
            known = {defaults[match["path"]]} if match["path"] in defaults else by_leaf.get(match["path"])
            if not known:
                continue
            claims += 1
            if _number(match["value"]) not in known:
                code = sorted(map(str, known))
                wrong.append(f"{page.name}: `{match['path']}` default {match['value']} (the code: {code})")
    assert wrong == []
    assert claims >= 3  # the check sees the pages' claims (docs/operations.md names several)
