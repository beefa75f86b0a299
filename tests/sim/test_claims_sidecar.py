"""The sidecar documents' claims modules (BLOC, DL3, ELS): registration, helpers, directions at small size."""

from __future__ import annotations

import numpy as np
import pytest

from knapsack_lb.sim.claims import bloc as claims_bloc
from knapsack_lb.sim.claims import dl3 as claims_dl3
from knapsack_lb.sim.claims import els as claims_els
from knapsack_lb.sim.reproduce import Experiment, experiments
from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import PolicySpec, load_scenario


@pytest.mark.parametrize("document", ["bloc", "dl3", "els"])
def test_each_document_registers_its_experiments(document: str) -> None:
    found = [e for e in experiments(document) if isinstance(e, Experiment)]
    assert found and all(e.document == document for e in found)


@pytest.mark.parametrize("name", ["bloc-40x10", "dl3-netdelay", "els-failing"])
def test_shipped_scenarios_load_and_name_their_policies(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name and len(scenario.policies) >= 2


def test_lc_baseline_runs_without_bloc_server_features() -> None:
    scenario = load_scenario("bloc-40x10")
    assert scenario.server.aqm and scenario.server.chips
    baseline = claims_bloc.without_bloc_server(scenario)
    assert not baseline.server.aqm and not baseline.server.chips


def test_bloc_narrows_the_range_in_a_short_closed_loop() -> None:
    scenario = load_scenario("bloc-40x10").with_changes(duration=40.0, warmup=10.0)
    lc, bloc = claims_bloc.run_pair(scenario, seed=3)
    assert bloc.spread_10_90 < 0.6 * lc.spread_10_90
    assert bloc.p99 < lc.p99
    assert claims_bloc.lost(bloc) < 0.06 and claims_bloc.lost(lc) == 0.0


def test_els_error_rate_bands_by_start_time() -> None:
    scenario = claims_els.reduced(duration=40.0, mean_service=0.2)
    result = run(scenario, "round_robin", 1)
    bands = claims_els.error_rates_by_band(result, scenario.duration, bands=2)
    assert len(bands) == 2
    # round robin: a quarter of the traffic on a machine failing half of it
    assert all(0.06 <= b <= 0.20 for b in bands)
    assert scenario.duration == 40.0 and scenario.clients.ramp[-1].at == 40.0


def test_dl3_delayed_request_count_uses_the_calm_tail() -> None:
    scenario = load_scenario("dl3-netdelay").with_changes(duration=20.0, warmup=1.0)
    calm = claims_dl3.without_delays(scenario)
    assert calm.network.spikes == () and calm.network.rtt == scenario.network.rtt
    spiky = run(scenario, scenario.policy("least_connections_p2c"), 1)
    quiet = run(calm, calm.policy("least_connections_p2c"), 1)
    assert claims_dl3.delayed_requests(quiet, quiet, 0.08) == 0
    hit = claims_dl3.delayed_requests(spiky, quiet, 0.08)
    assert hit > 0
    assert hit == int((spiky.latencies > quiet.p9999 + 0.04).sum())
    assert np.isfinite(spiky.p9999)


@pytest.mark.parametrize("policy", ["bloc", "els", "dl3"])
def test_document_policies_are_deterministic_for_a_seed(policy: str) -> None:
    scenario = load_scenario("bloc-40x10").with_changes(duration=8.0, warmup=1.0,
                                                        server={"aqm": True, "chips": True, "piggyback_inflight": True})
    spec = PolicySpec(name=policy, params={"probe_interval": 0.05} if policy == "dl3" else {})
    first, again, other = (run(scenario, spec, seed) for seed in (5, 5, 6))
    assert first.summary() | {"wall_seconds": 0} == again.summary() | {"wall_seconds": 0}
    assert first.latencies.tolist() != other.latencies.tolist()
