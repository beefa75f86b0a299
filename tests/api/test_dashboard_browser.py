"""The dashboard in a real headless Chromium: plots rendered, nothing fetched from the internet.

A real uvicorn serves the dashboard over the real Redis store seeded with one VIP (three
DIPs with curves, plan history and probe rounds). Chromium (Debian ``chromium``) loads it
twice: once dumping the DOM after scripts ran (plotly draws each plot as ``svg.main-svg``
elements), once taking a screenshot, kept as ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import pytest
from PIL import Image

from knapsack_lb.lab.procs import RedisServer
from tests.api.conftest import TOKEN, live_server
from tests.api.seed import APPLY_ERROR, DIPS

CHROMIUM = Path("/usr/bin/chromium")
URL_PATTERN = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def chromium(url: str, user_data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={user_data}", "--window-size=1400,1000", "--virtual-time-budget=5000", *extra, url,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is installed by make test")
def test_dashboard_renders_every_plot_in_chromium(redis_server: RedisServer, artifacts_dir: Path,
                                                  tmp_path: Path) -> None:
    with live_server(redis_server.url, "dashboard", dashboard_refresh=0) as server:
        page = httpx.get(f"{server.url}/dashboard", timeout=10).text
        assert '<script src="/static/plotly.min.js">' in page
        assert not URL_PATTERN.search(page), "the page must not load anything from another origin"
        assert not re.search(r"https?://", page)
        js = httpx.get(f"{server.url}/static/plotly.min.js", timeout=10)
        assert js.status_code == 200 and len(js.content) > 1_000_000  # plotly.js from the wheel, served locally

        dom = chromium(f"{server.url}/dashboard?vip=web", tmp_path / "profile-dom", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        plots = len(DIPS) + 2  # one curve per DIP, weights over time, latency over time
        assert dom.stdout.count('class="main-svg"') >= plots  # plotly drew every plot
        assert dom.stdout.count('class="plot curve') == len(DIPS)
        for dip in DIPS:
            assert dip in dom.stdout
        assert "plan v3" in dom.stdout  # the summary table was filled from the embedded data

        shot = artifacts_dir / "dashboard.png"
        shot.unlink(missing_ok=True)
        result = chromium(f"{server.url}/dashboard?vip=web", tmp_path / "profile-shot", f"--screenshot={shot}")
        assert result.returncode == 0, result.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000
    with Image.open(shot) as image:
        assert image.size == (1400, 1000)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert colours is not None and len(colours) > 200  # lines, markers, text: not a blank page


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is installed by make test")
def test_dashboard_shows_paused_dry_run_and_apply_error_states(redis_server: RedisServer, artifacts_dir: Path,
                                                               tmp_path: Path) -> None:
    """What an operator on call must see at a glance: the VIP paused, in dry run, the load balancer
    refusing plans (with its reason), DIPs still learning, and the LB's weights beside the plan's.
    One screenshot per state is kept in test-artifacts/."""
    with live_server(redis_server.url, "dashboard-states", dashboard_refresh=0) as server:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        dom = _rendered(server.url, tmp_path / "profile-error")
        assert "apply failing" in dom and APPLY_ERROR in dom  # the seeded controller state: HAProxy unreachable
        assert "learning: dip3" in dom and "LB weight" in dom and "0.5000" in dom  # dip1: LB 0.5 beside plan 0.42
        assert "slow-start" in dom and "1/100" in dom  # the plan's flag; dip3's probe errors
        assert "paused:" not in dom and "dry run:" not in dom
        _screenshot(server.url, tmp_path / "shot-error", artifacts_dir / "dashboard-apply-error.png")

        assert httpx.post(f"{server.url}/api/v1/vips/web/pause", headers=headers, timeout=10).status_code == 200
        dom = _rendered(server.url, tmp_path / "profile-paused")
        assert "paused: nothing is computed or pushed" in dom
        _screenshot(server.url, tmp_path / "shot-paused", artifacts_dir / "dashboard-paused.png")

        assert httpx.post(f"{server.url}/api/v1/vips/web/resume", headers=headers, timeout=10).status_code == 200
        put = httpx.put(f"{server.url}/api/v1/vips/web/dry-run", json={"enabled": True}, headers=headers, timeout=10)
        assert put.status_code == 200
        dom = _rendered(server.url, tmp_path / "profile-dry")
        assert "dry run: plans are not pushed" in dom and "paused:" not in dom
        _screenshot(server.url, tmp_path / "shot-dry", artifacts_dir / "dashboard-dry-run.png")


def _rendered(url: str, profile: Path) -> str:
    """The alerts and summary sections as the page's script filled them (not the script's own text)."""
    result = chromium(f"{url}/dashboard?vip=web", profile, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    sections = re.findall(r'<section id="(?:alerts|summary)">(.*?)</section>', result.stdout, re.DOTALL)
    assert len(sections) == 2
    return "\n".join(sections)


def _screenshot(url: str, profile: Path, shot: Path) -> None:
    shot.unlink(missing_ok=True)
    result = chromium(f"{url}/dashboard?vip=web", profile, f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert colours is not None and len(colours) > 200
