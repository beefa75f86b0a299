"""Third-party adapters: a distribution outside this repository registers its adapter under
the entry-point group ``knapsack_lb.adapters`` and is selected by name, with no change here.

The example distribution lives in tests/fixtures/third_party_adapter/ (its own pyproject.toml
with the entry point). It is installed for real with pip (``--target``, offline, no build
isolation) into a temporary directory; the test then loads it by name through
``adapters.base.load_adapter_class`` in a fresh interpreter whose path includes that
directory, and also in this process through a ``*.dist-info`` on ``sys.path``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from adapters.base import load_adapter_class, make_adapter
from knapsack_lb.config import parse_config
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import WeightPlan
from knapsack_lb.service.adapters import adapter_factory

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "third_party_adapter"
PLUGIN = "example-json-file"


def _dist_info_from_pyproject(site: Path) -> None:
    """What an installer writes: METADATA and entry_points.txt in ``<name>-<version>.dist-info``."""
    project = tomllib.loads((FIXTURE / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    shutil.copytree(FIXTURE / "src" / "klb_example_adapter", site / "klb_example_adapter")


def test_unknown_adapter_names_what_is_installed() -> None:
    with pytest.raises(InvalidInputError) as info:
        load_adapter_class(PLUGIN)
    assert "haproxy" in str(info.value) and "nginx" in str(info.value)


def test_plugin_on_sys_path_is_selected_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    _dist_info_from_pyproject(site)
    monkeypatch.syspath_prepend(str(site))
    cls = load_adapter_class(PLUGIN)
    assert cls.__module__ == "klb_example_adapter"
    config = parse_config({
        "load_balancers": {"files": {"adapter": PLUGIN, "settings": {"path": str(tmp_path / "w.json"), "total": 10}}},
        "vips": [{"name": "web", "adapter": {"lb": "files"}}],
    })
    adapter = adapter_factory(config.load_balancers)(config.vips[0])
    result = adapter.apply(WeightPlan(vip="web", weights={"a": 0.3, "b": 0.7}))
    assert result.ok and dict(result.lb_weights) == {"a": 3, "b": 7}
    assert adapter.read() == pytest.approx({"a": 0.3, "b": 0.7})
    with pytest.raises(InvalidInputError, match=r"adapter\.settings\.path"):
        make_adapter(PLUGIN, {"path": "relative.json"})


def test_plugin_installed_with_pip_is_loaded_by_name(tmp_path: Path) -> None:
    source = tmp_path / "src-copy"
    shutil.copytree(FIXTURE, source)  # the build writes egg-info/build dirs: keep them out of the repo
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    assert (target / "klb_example_adapter-0.1.0.dist-info" / "entry_points.txt").exists()
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(target)!r})
        from adapters.base import make_adapter
        from knapsack_lb.model import WeightPlan
        adapter = make_adapter({PLUGIN!r}, {{"path": {str(tmp_path / "out.json")!r}}})
        result = adapter.apply(WeightPlan(vip="web", weights={{"a": 0.1, "b": 0.3, "c": 0.6}}))
        print(json.dumps({{"ok": result.ok, "module": type(adapter).__module__, "weights": dict(result.lb_weights)}}))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {
        "ok": True,
        "module": "klb_example_adapter",
        "weights": {"a": 10, "b": 30, "c": 60},
    }
    assert json.loads((tmp_path / "out.json").read_text())["weights"] == {"a": 10, "b": 30, "c": 60}
