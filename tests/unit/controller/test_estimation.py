"""The learner's statistics on known answers: a round's standard error, pooling, the capacity estimate
from rounds of M/M/1, M/M/2 and M/M/c DIPs, overload backoff and the change test."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import numpy as np
import pytest

from knapsack_lb.controller.estimation import (
    BACKOFF,
    LIGHT_PRECISION,
    PRIOR_SPREAD,
    RELAXED_LEVELS,
    RoundEvidence,
    between_round_spread,
    by_weight,
    change_direction,
    critical,
    disagreement,
    estimate,
    is_overload,
    light_latency,
    own_prior,
    own_unloaded,
    pool_prior,
    pooled,
    probe_spread,
    round_evidence,
    seen_under_load,
    unloaded_latency,
)
from knapsack_lb.curves import curve_from_dict
from knapsack_lb.curves.utilisation import UtilisationCurve, shape_fits
from knapsack_lb.lab.fluid import erlang_c
from knapsack_lb.model import Measurement
from knapsack_lb.rounds import RoundSamples, summarise

Z = 2.0
KW = {"z": Z, "tolerance": 0.02, "drop_factor": 5.0, "failure_share": 0.01}


def _round(t: float, weight: float, mean: float, n: int = 400, cv: float = 0.05, failed: float = 0.0) -> RoundEvidence:
    """A round whose standard error is ``cv`` of its mean."""
    return RoundEvidence(t, weight, mean, cv * mean * math.sqrt(n), n, failed)


def test_a_rounds_standard_error_comes_from_its_own_spread() -> None:
    samples = RoundSamples()
    samples.success_latencies.extend([0.010, 0.012, 0.014, 0.016, 0.018])
    m = summarise(samples, vip="v", dip="d", time=5.0, weight=0.25, worker="w")
    ev = round_evidence(m, 0.25)
    assert ev is not None and ev.n == 5 and ev.weight == 0.25
    assert ev.std == pytest.approx(statistics.stdev(samples.success_latencies))
    assert ev.std / math.sqrt(ev.n) == pytest.approx(m.latency_stderr)


def test_a_round_without_its_spread_counts_as_exponential_and_the_lbs_share_wins() -> None:
    m = Measurement(vip="v", dip="d", time=5.0, weight=0.5, sent=1, successes=1, errors=0, timeouts=0,
                    latency_mean=0.02, latency_p50=0.02, latency_p90=0.02, latency_p99=0.02,
                    failure_latency_mean=None, worker="w", share=0.3)
    ev = round_evidence(m, 0.5)
    assert ev is not None and ev.std == 0.02 and ev.weight == 0.3


def test_pooled_rounds_equal_one_round_of_all_their_requests() -> None:
    rng = random.Random(3)
    a = [rng.expovariate(100.0) for _ in range(30)]
    b = [rng.expovariate(80.0) for _ in range(50)]
    rounds = [RoundEvidence(0.0, 0.2, statistics.fmean(x), statistics.stdev(x), len(x), 0.0) for x in (a, b)]
    p = pooled(rounds)
    everything = a + b
    assert p.n == 80 and p.rounds == 2
    assert p.mean == pytest.approx(statistics.fmean(everything))
    assert p.stderr == pytest.approx(statistics.stdev(everything) / math.sqrt(80))


def test_rounds_group_by_weight_within_the_tolerance() -> None:
    bins = by_weight([_round(0, 0.200, 0.01), _round(1, 0.203, 0.012), _round(2, 0.3, 0.02)], 0.02)
    assert [b.rounds for b in bins] == [2, 1]


def test_rounds_group_by_the_weight_they_were_taken_under_at_their_mean_share() -> None:
    """The share the LB counted over a round is noisy (a few hundred requests or a few connections);
    grouped by that noise, the rounds' spread in weight dilutes the curve's slope and its saturation
    comes out high. Grouped by the weight the LB carried, each group stands at its rounds' mean share:
    an M/M/1 DIP's saturation is exact from rounds whose shares scatter +-30 % around two weights."""
    s, c = 0.010, 0.5
    taken = [(w, jitter) for w in (0.1, 0.3) for jitter in (-0.3, 0.0, 0.3)]
    rounds = [replace(_round(i, w * (1 + jitter), s / (1 - w / c), cv=1e-4), configured=w)
              for i, (w, jitter) in enumerate(taken)]
    bins = by_weight(rounds, 0.02)
    assert [b.rounds for b in bins] == [3, 3]
    assert [b.weight for b in bins] == pytest.approx([0.1, 0.3])
    grouped = estimate(rounds, None, **KW)
    assert grouped is not None and grouped.saturation == pytest.approx(c, rel=1e-3)
    scattered = estimate([replace(r, configured=math.nan) for r in rounds], None, **KW)
    assert scattered is not None and scattered.saturation > 1.1 * c


@pytest.mark.parametrize(("w1", "w2"), [(0.1, 0.4), (0.05, 0.25)])
def test_capacity_of_an_mm1_dip_from_one_light_and_one_loaded_round(w1: float, w2: float) -> None:
    s, c = 0.010, 0.5  # M/M/1: latency = s / (1 - w / c)
    rounds = [_round(0, w1, s / (1 - w1 / c), cv=1e-4), _round(5, w2, s / (1 - w2 / c), cv=1e-4)]
    est = estimate(rounds, None, **KW)
    assert est is not None
    assert est.s == pytest.approx(s, rel=1e-3) and est.saturation == pytest.approx(c, rel=1e-3)
    assert est.cap <= c


def test_capacity_of_an_mm2_dip_is_exact_with_the_k2_knee() -> None:
    s, c = 0.010, 0.6  # M/M/2: latency = s / (1 - rho^2)
    rounds = [_round(i, w, s / (1 - (w / c) ** 2), cv=1e-4) for i, w in enumerate((0.1, 0.3, 0.45, 0.5))]
    est = estimate(rounds, None, **KW)
    assert est is not None and est.k == 2
    assert est.saturation == pytest.approx(c, rel=1e-3) and est.s == pytest.approx(s, rel=1e-3)


def _mmc(servers: int, mu: float, rate: float) -> float:
    return 1 / mu + erlang_c(servers, rate / mu) / (servers * mu - rate)


def test_capacity_of_an_mmc_dip_is_close_and_its_bound_safe() -> None:
    servers, mu, total = 8, 100.0, 1000.0  # saturation at weight 0.8
    rounds = [_round(i, w, _mmc(servers, mu, w * total)) for i, w in enumerate((0.2, 0.4, 0.55, 0.65, 0.7))]
    est = estimate(rounds, None, **KW)
    assert est is not None
    assert est.saturation == pytest.approx(0.8, rel=0.15)  # the gentlest knee the data allow: a little high
    assert est.cap < 0.8  # the lower confidence bound never claims more than the DIP has


def test_the_saturation_has_an_upper_bound_once_the_knee_is_seen_and_never_past_a_drop() -> None:
    """The M/M/c DIP seen at its knee: its saturation (0.8) lies between the confidence bounds, and
    more noise widens them; a DIP seen only flat has no upper bound; one overloaded at 0.4 none above 0.4."""
    servers, mu, total = 8, 100.0, 1000.0
    weights = (0.2, 0.4, 0.55, 0.65, 0.7)
    knee = estimate([_round(i, w, _mmc(servers, mu, w * total)) for i, w in enumerate(weights)], None, **KW)
    noisy = estimate([_round(i, w, _mmc(servers, mu, w * total), cv=0.2) for i, w in enumerate(weights)], None,
                     **KW)
    assert knee is not None and noisy is not None
    assert knee.cap < 0.8 < knee.ceiling < math.inf
    assert noisy.ceiling > knee.ceiling and noisy.cap <= knee.cap
    flat = estimate([_round(i, 0.2, 0.010) for i in range(3)], 0.010, **KW, floor=0.05)
    assert flat is not None and flat.ceiling == math.inf
    dropped = estimate([_round(0, 0.1, 0.010), _round(5, 0.2, 0.011), _round(10, 0.4, 0.2, failed=0.3)], None, **KW)
    assert dropped is not None and dropped.ceiling <= 0.4


def test_a_flat_dip_grows_by_a_bounded_factor_and_the_floor() -> None:
    flat = [_round(i, 0.2, 0.010) for i in range(3)]
    est = estimate(flat, 0.010, **KW, floor=0.05)
    assert est is not None and 0.2 < est.cap < 0.4  # no rise seen: a bounded step up, not the whole VIP
    tiny = estimate([_round(0, 0.002, 0.010)], 0.010, **KW, floor=0.05)
    assert tiny is not None and tiny.cap == pytest.approx(0.05)  # nearly idle: the floor share


def test_the_floor_is_for_a_dip_seen_nearly_idle() -> None:
    """The pool's unloaded latency 10 ms, known to 25 %; a light latency known to 12.5 %: at z = 2 a
    DIP whose light latency is above 15 ms / 0.75 = 20 ms was seen under load and a flat fit of its
    loaded rounds gets no floor (an M/M/1 DIP at 75 % utilisation sits at 40 ms); without a pool or a
    light latency it was not. A DIP seen only at (nearly) no load keeps the floor whatever its latency:
    that latency is its unloaded one (a slow host), not load."""
    bound = 0.010 * (1 + Z * PRIOR_SPREAD) / (1 - Z * LIGHT_PRECISION)
    assert bound == pytest.approx(0.020)
    assert not seen_under_load(0.012, 0.010, Z)
    assert not seen_under_load(0.99 * bound, 0.010, Z)
    assert seen_under_load(1.01 * bound, 0.010, Z)
    assert seen_under_load(0.010 / (1 - 0.75), 0.010, Z)
    assert not seen_under_load(0.040, None, Z)
    assert not seen_under_load(math.inf, 0.010, Z)
    # flat at 40 ms over shares 0.008-0.012: without the floor the cap stays near what it carried
    loaded = [_round(i, w, 0.040) for i, w in enumerate((0.008, 0.010, 0.012))]
    floored = estimate(loaded, 0.040, **KW, floor=0.05)
    bare = estimate(loaded, 0.040, **KW, floor=0.05, under_load=seen_under_load(0.040, 0.010, Z))
    assert floored is not None and bare is not None
    assert floored.cap == pytest.approx(0.05) and bare.cap < 0.024
    idle = estimate([_round(i, 0.0, 0.040) for i in range(3)], 0.040, **KW, floor=0.05, under_load=True)
    assert idle is not None and idle.cap == pytest.approx(0.05)


def test_looser_confidence_levels_move_each_cap_by_its_own_uncertainty() -> None:
    """The caps at looser levels rise with each level and stay below the best estimate of the
    saturation for a DIP seen at its knee; a DIP seen only flat gains more (its bound is the lowest
    over the knee shapes its points cannot reject, a steep one among them, so about 2 % at 0.75 z
    here against a third for ``k = 1`` alone); an overloaded DIP never passes the backoff below the
    weight that overloaded it."""
    servers, mu, total = 8, 100.0, 1000.0
    knee = estimate([_round(i, w, _mmc(servers, mu, w * total)) for i, w in enumerate((0.2, 0.4, 0.55, 0.65, 0.7))],
                    None, **KW)
    assert knee is not None and len(knee.relaxed) == len(RELAXED_LEVELS)
    assert knee.cap <= knee.relaxed[0] <= knee.relaxed[1] <= knee.relaxed[2] < knee.saturation
    flat = estimate([_round(i, 0.2, 0.010) for i in range(3)], 0.010, **KW, floor=0.05)
    assert flat is not None and flat.relaxed[0] > flat.cap
    assert flat.relaxed[0] / flat.cap > knee.relaxed[0] / knee.cap
    dropped = estimate([_round(0, 0.1, 0.010), _round(5, 0.2, 0.011), _round(10, 0.4, 0.2, failed=0.3)], None,
                       **KW, floor=0.5)
    assert dropped is not None and max(dropped.relaxed) <= max(BACKOFF * 0.4, 0.2)


def test_an_overload_backs_off_from_the_weight_that_caused_it() -> None:
    rounds = [_round(0, 0.1, 0.010), _round(5, 0.2, 0.011), _round(10, 0.4, 0.2, failed=0.3)]
    est = estimate(rounds, None, **KW, floor=0.5)
    assert est is not None and est.overloaded
    assert est.cap <= max(BACKOFF * 0.4, 0.2) and est.saturation <= 0.4
    only = estimate([_round(0, 0.3, 0.5, failed=0.5)], 0.01, **KW)
    assert only is not None and only.cap == pytest.approx(BACKOFF * 0.3)


def test_a_clean_round_at_the_drops_own_weight_does_not_stop_the_backoff() -> None:
    """Clean at 0.275, overloaded at 0.277 (the same weight within the tolerance): the cap falls to
    half of the drop or the last clean weight *below* it (0.12), not to 0.275."""
    rounds = [_round(0, 0.12, 0.011), _round(5, 0.275, 0.030), _round(10, 0.277, 0.5, failed=0.5)]
    est = estimate(rounds, 0.010, **KW, floor=0.05)
    assert est is not None and est.overloaded and est.cap <= BACKOFF * 0.277 + 1e-9


def test_the_drop_level_comes_from_pooled_rounds_not_the_luckiest_one() -> None:
    """Three five-probe rounds at one light weight average 10 ms, the luckiest 4 ms: a round at
    45 ms is 4.5x the unloaded latency (no drop), not 11x the luckiest round."""
    light = [_round(t, 0.1, mean, n=5, cv=1 / math.sqrt(5)) for t, mean in ((0, 0.004), (5, 0.012), (10, 0.014))]
    loaded = _round(15, 0.3, 0.045, n=5, cv=1 / math.sqrt(5))
    est = estimate([*light, loaded], None, **KW, floor=0.5)
    assert est is not None and not est.overloaded
    slow = _round(15, 0.3, 0.150, n=20, cv=1 / math.sqrt(20))  # 15x, lower bound about 7.5x
    est = estimate([*light, slow], None, **KW, floor=0.5)
    assert est is not None and est.overloaded and est.cap <= 0.15


def test_a_drop_needs_proof() -> None:
    """Exponential probes (spread = mean), 10 ms unloaded, drop at 5x: five probes at 60 ms prove
    nothing (their mean's lower bound is below 50 ms), twenty at 150 ms prove the drop; one probe
    is never latency evidence."""
    def probes(mean: float, n: int) -> RoundEvidence:
        return RoundEvidence(0.0, 0.3, mean, mean, n, 0.0)

    z, drop = Z, 5.0
    assert not is_overload(probes(0.060, 5), 0.010, drop, 0.5, z)
    assert is_overload(probes(0.150, 20), 0.010, drop, 0.5, z)
    assert not is_overload(probes(10.0, 1), 0.010, drop, 0.5, z)
    assert is_overload(RoundEvidence(0.0, 0.3, 0.010, 0.010, 5, 0.8), 0.010, drop, 0.5, z)  # failures drop



def _clustered_rounds(rng: random.Random, tau: float, count: int, weight: float = 0.2, n: int = 5,
                      cv: float = 0.3) -> list[RoundEvidence]:
    """Rounds whose probes share one state of the DIP: each round's true mean is log-normal around
    10 ms with spread ``tau``, its ``n`` probes spread ``cv`` around that mean."""
    rounds = []
    for i in range(count):
        centre = 0.010 * math.exp(rng.gauss(0.0, tau) - tau ** 2 / 2)
        probes = [centre * max(0.05, rng.gauss(1.0, cv)) for _ in range(n)]
        rounds.append(RoundEvidence(float(i), weight, statistics.fmean(probes), statistics.stdev(probes), n, 0.0))
    return rounds


@pytest.mark.parametrize("tau", [0.3, 0.6])
def test_the_spread_between_rounds_is_estimated_from_same_weight_pairs(tau: float) -> None:
    rng = random.Random(11)
    dips = [_clustered_rounds(rng, tau, 40) for _ in range(6)]
    assert between_round_spread(dips, 0.1, Z) == pytest.approx(tau, rel=0.25)


def test_rounds_that_agree_within_their_own_noise_have_no_spread_between_them() -> None:
    rng = random.Random(5)
    dips = [_clustered_rounds(rng, 0.0, 40) for _ in range(6)]
    assert between_round_spread(dips, 0.1, Z) == 0.0  # their estimate's own noise is no spread
    assert between_round_spread([dips[0][:4]], 0.1, Z) == 0.0  # too few pairs to say
    apart = [RoundEvidence(float(i), 0.1 * (i + 1), 0.01 * (i + 1), 0.001, 5, 0.0) for i in range(10)]
    assert between_round_spread([apart], 0.1, Z) == 0.0  # rounds at different weights are no pairs


def test_the_spread_between_rounds_pairs_rounds_under_one_configured_weight() -> None:
    """Rounds under one weight whose counted shares alternate 20 % below and above it are pairs; by
    their shares, none."""
    rng = random.Random(13)
    dips = [[replace(r, weight=r.weight * (0.8 if i % 2 else 1.2), configured=r.weight)
             for i, r in enumerate(_clustered_rounds(rng, 0.5, 40))] for _ in range(6)]
    assert between_round_spread(dips, 0.02, Z) == pytest.approx(0.5, rel=0.25)
    by_share = [[replace(r, configured=math.nan) for r in d] for d in dips]
    assert between_round_spread(by_share, 0.02, Z) == 0.0


def test_a_dips_one_change_is_not_spread() -> None:
    """A level shift is one pair of a DIP's rounds, not noise: the median over pairs ignores it."""
    rng = random.Random(8)
    dips = [_clustered_rounds(rng, 0.0, 20) for _ in range(6)]
    shifted = [[r if r.time < 10 else RoundEvidence(r.time, r.weight, r.mean * 2, r.std * 2, r.n, 0.0) for r in d]
               for d in dips]
    assert between_round_spread(shifted, 0.1, Z) < 0.05


def test_the_spread_between_rounds_widens_the_drop_and_change_tests() -> None:
    """Five probes at 120 ms, 10 ms unloaded, tight among themselves: a drop on their own spread,
    none where rounds at one weight vary by 60 %; likewise a round 50 % above its curve."""
    tight = RoundEvidence(0.0, 0.3, 0.120, 0.012, 5, 0.0)
    assert is_overload(tight, 0.010, 5.0, 0.5, Z)
    assert not is_overload(tight, 0.010, 5.0, 0.5, Z, spread=0.6)
    curve = UtilisationCurve(0.010, 0.5, 1.0)
    above = _round(0, 0.25, curve.latency(0.25) * 1.5)
    kw = {"z": Z, "threshold": 0.2, "failure_share": 0.01}
    assert disagreement(above, curve, **kw) == 1
    assert disagreement(above, curve, **kw, spread=0.3) == 0


def test_a_change_needs_confirmed_disagreement_beyond_noise() -> None:
    curve = UtilisationCurve(0.010, 0.5, 1.0)
    at = curve.latency(0.25)
    kw = {"z": Z, "threshold": 0.2, "failure_share": 0.01}
    assert change_direction([_round(0, 0.25, at * 1.05)], curve, **kw) == 0
    assert change_direction([_round(0, 0.25, at * 1.5)], curve, **kw) == 1
    assert change_direction([_round(0, 0.25, at / 1.5)], curve, **kw) == -1
    noisy = _round(0, 0.25, at * 1.5, n=4, cv=0.5)  # 50 % higher, but within its own noise
    assert change_direction([noisy], curve, **kw) == 0
    mixed = [_round(0, 0.25, at * 1.5), _round(5, 0.25, at * 0.5)]
    assert change_direction(mixed, curve, **kw, confirmations=2) == 0
    failing = [_round(0, 0.25, at, failed=0.5), _round(5, 0.25, at * 1.5)]
    assert change_direction(failing, curve, **kw, confirmations=2) == 1
    assert change_direction(failing[-1:], curve, **kw, confirmations=2) == 0  # one round is no confirmation


def test_a_round_under_the_asymptote_a_drop_left_is_no_change() -> None:
    """A drop at share 0.42 put the curve's saturation there, though the DIP (M/M/1, 10 ms, capacity
    0.5) saturates at 0.5: at 0.38 the curve says 105 ms and the DIP serves 41.7 ms. With the drop
    level at 50 ms that is no capacity gain; a slower round there, and a faster one further down
    where the curve says 19 ms, are still judged."""
    clamped = UtilisationCurve(0.010, 0.42, 1.0)
    kw = {"z": Z, "threshold": 0.2, "failure_share": 0.01}
    under = _round(0, 0.38, 0.010 / (1 - 0.38 / 0.5))
    assert clamped.latency(0.38) > 0.100
    assert change_direction([under], clamped, **kw) == -1
    assert change_direction([under], clamped, **kw, drop_latency=0.050) == 0
    assert disagreement(under, clamped, **kw, drop_latency=0.050) is None
    slower = _round(0, 0.38, clamped.latency(0.38) * 1.5)
    assert change_direction([slower], clamped, **kw, drop_latency=0.050) == 1
    lower = _round(0, 0.2, clamped.latency(0.2) / 1.5)
    assert change_direction([lower], clamped, **kw, drop_latency=0.050) == -1


def test_one_rounds_disagreement_has_a_direction_and_a_curve_that_says_nothing_gives_none() -> None:
    curve = UtilisationCurve(0.010, 0.5, 1.0)
    at = curve.latency(0.25)
    kw = {"z": Z, "threshold": 0.2, "failure_share": 0.01}
    assert disagreement(_round(0, 0.25, at * 1.05), curve, **kw) == 0
    assert disagreement(_round(0, 0.25, at * 1.5), curve, **kw) == 1
    assert disagreement(_round(0, 0.25, at / 1.5), curve, **kw) == -1
    assert disagreement(_round(0, 0.25, at, failed=0.5), curve, **kw) == 1  # failed probes at a safe weight
    assert disagreement(_round(0, 0.6, 1.0), curve, **kw) is None  # past the curve's asymptote
    # a fit whose rounds vary 25x more than their spread says widens the bound 5x (0.1 -> 0.5 in log): 1.5x is noise
    assert disagreement(_round(0, 0.25, at * 1.5), curve, dispersion=25.0, **kw) == 0


def test_a_change_is_judged_on_the_log_scale_with_the_rounds_coefficient_of_variation() -> None:
    """A latency's spread grows with its mean, so a round that came out low by chance has a low spread
    too: judged on that spread alone, chance looks like a capacity gain. On the log scale a round at
    1/1.5 of its curve is the same news as one at 1.5 times it. Twenty probes with a coefficient of
    variation of 1 (exponential): t(19) at z = 2 is 2.09, so the bound is 2.09 / sqrt(20) = 0.47 in
    log, beyond ln 1.5 = 0.41 and within ln 2.5 = 0.92."""
    curve = UtilisationCurve(0.005, 1.0, 1.0)
    at = curve.latency(0.7)

    def twice(mean: float) -> list[RoundEvidence]:
        return [RoundEvidence(t, 0.7, mean, mean, 20, 0.0) for t in (0.0, 5.0)]

    kw = {"z": Z, "threshold": 0.2, "failure_share": 0.01, "confirmations": 2}
    assert change_direction(twice(at / 1.5), curve, **kw) == 0
    assert change_direction(twice(at * 1.5), curve, **kw) == 0
    assert change_direction(twice(at / 2.5), curve, **kw) == -1
    assert change_direction(twice(at * 2.5), curve, **kw) == 1


def test_one_probes_spread_is_pooled_over_a_dips_rounds_by_their_degrees_of_freedom() -> None:
    rounds = [RoundEvidence(0.0, 0.2, 0.010, 0.005, 5, 0.0),  # coefficient of variation 0.5, 4 degrees of freedom
              RoundEvidence(1.0, 0.3, 0.020, 0.020, 9, 0.0),  # 1.0, 8 degrees of freedom
              RoundEvidence(2.0, 0.3, 0.020, 0.0, 1, 0.0),  # one probe: no spread of its own
              RoundEvidence(3.0, 0.4, math.inf, math.inf, 0, 1.0)]  # every probe failed
    assert probe_spread(rounds) == pytest.approx(math.sqrt((4 * 0.25 + 8 * 1.0) / 12))
    assert probe_spread(rounds[2:]) is None


def test_a_round_that_missed_the_slow_tail_counts_at_least_its_dips_spread() -> None:
    """Exponential service (coefficient of variation 1): two rounds of five probes at 1/2.2 of the
    curve, each tight among its own probes (0.2), are no capacity gain: at the DIP's pooled spread
    (0.92 over ten earlier rounds) t(4) * 0.92 / sqrt(5) = 1.18 in log is beyond ln 2.2 = 0.79. At a
    quarter of the curve (ln 4 = 1.39) the gain is news, and on a DIP whose probes are always that
    tight, 1/2.2 is too."""
    curve = UtilisationCurve(0.010, 1.0, 1.0)
    at = curve.latency(0.7)
    kw = {"z": Z, "threshold": 0.2, "failure_share": 0.01, "confirmations": 2}

    def rounds(mean: float, cv: float, times: range) -> list[RoundEvidence]:
        return [RoundEvidence(float(t), 0.7, mean, cv * mean, 5, 0.0) for t in times]

    history, tight = rounds(at, 1.0, range(10)), rounds(at / 2.2, 0.2, range(10, 12))
    assert change_direction(tight, curve, **kw) == -1  # on their own spread alone
    assert change_direction([*history, *tight], curve, **kw) == 0
    assert change_direction([*history, *rounds(at / 4, 0.2, range(10, 12))], curve, **kw) == -1
    assert change_direction([*rounds(at, 0.2, range(10)), *tight], curve, **kw) == -1


def test_a_few_probes_need_students_t_not_z() -> None:
    assert critical(2.0, 5) == pytest.approx(2.87, abs=0.01)  # t quantile, 4 degrees of freedom, p = 0.977
    assert critical(2.0, 1000) == pytest.approx(2.0, abs=0.01)
    assert critical(2.0, 1) == 2.0  # no spread of its own: the assumed exponential spread, z stands
    curve = UtilisationCurve(0.010, 1.0, 1.0)
    at = curve.latency(0.25)
    # five probes 2.5 standard errors (of the log-latency) above the curve: beyond z = 2, not beyond t(4)
    few = RoundEvidence(0.0, 0.25, at * 1.5, at * 1.5 * math.log(1.5) / 2.5 * math.sqrt(5), 5, 0.0)
    assert change_direction([few], curve, z=Z, threshold=0.2, failure_share=0.01) == 0
    assert change_direction([few], curve, z=1.5, threshold=0.2, failure_share=0.01) == 1  # t(4) at z = 1.5: 1.8


def test_the_pool_prior_is_the_lower_quartile_of_the_lowest_latencies() -> None:
    assert pool_prior([0.01, 0.02, 0.03, 0.04, 0.05]) == pytest.approx(0.02)
    assert pool_prior([math.inf]) is None


def _exponential_round(rng: random.Random, t: float, weight: float, mean: float, n: int) -> RoundEvidence:
    samples = [rng.expovariate(1 / mean) for _ in range(n)]
    return RoundEvidence(t, weight, statistics.fmean(samples), statistics.stdev(samples), n, 0.0)


def test_the_light_latency_is_not_the_luckiest_round() -> None:
    """37 DIPs of exponential service (150 ms) at light load, 100 rounds of four probes each: the
    lowest round of the median DIP is under a third of the service time; pooled rounds give it
    within the pool prior's own spread for every DIP."""
    rng = random.Random(7)
    dips = [[_exponential_round(rng, 5.0 * i, rng.uniform(0.009, 0.011), 0.150, 4) for i in range(100)]
            for _ in range(37)]
    assert statistics.median(min(r.mean for r in rounds) for rounds in dips) < 0.3 * 0.150
    light = [light_latency(rounds, Z) for rounds in dips]
    assert statistics.median(light) == pytest.approx(0.150, rel=0.1)
    assert all(v == pytest.approx(0.150, rel=2 * PRIOR_SPREAD) for v in light)


def test_the_light_latency_pools_the_lightest_rounds_and_stops_where_load_shows() -> None:
    # fixed service: the lightest round is exact, the rounds above it are not needed
    assert light_latency([_round(0, 0.5, 0.050, n=5, cv=0.0), _round(5, 0.1, 0.020, n=5, cv=0.0)], Z) == 0.020
    # three noisy light rounds (10 ms pooled, known to 28 %) and one slower beyond their noise: the light
    # rounds alone, though they are not known to 12.5 %
    light = [_round(t, 0.1, mean, n=5, cv=1 / math.sqrt(5)) for t, mean in ((0, 0.004), (5, 0.012), (10, 0.014))]
    loaded = _round(15, 0.3, 0.150, n=20, cv=1 / math.sqrt(20))
    assert light_latency([*light, loaded], Z) == pytest.approx(0.010)
    assert light_latency([], Z) == math.inf
    assert light_latency([RoundEvidence(0.0, 0.1, math.nan, 0.0, 0, 1.0)], Z) == math.inf


def test_the_drop_level_comes_from_the_pools_light_latencies_not_its_lowest_rounds() -> None:
    """37 DIPs of exponential service (150 ms), 100 light rounds of four probes each: the lower quartile
    of their lowest rounds is a fraction of the service time, that of their light latencies is within
    the prior's spread of it. A round at twice the service time is no drop against the latter; one at
    eight times is, against either."""
    rng = random.Random(11)
    dips = [[_exponential_round(rng, 5.0 * i, rng.uniform(0.009, 0.011), 0.150, 4) for i in range(100)]
            for _ in range(37)]
    biased = pool_prior([min(r.mean for r in rounds) for rounds in dips])
    reference = pool_prior([light_latency(rounds, Z) for rounds in dips])
    assert biased is not None and reference is not None
    assert biased < 0.3 * 0.150
    assert reference == pytest.approx(0.150, rel=PRIOR_SPREAD)

    def overloaded(latency: float, drop_reference: float | None) -> bool:
        # the newest of the DIP's rounds at a weight ten times its light one, known to 10 %
        rounds = [*dips[0][-20:], RoundEvidence(500.0, 0.1, latency, latency / 3, 12, 0.0)]
        unloaded = None if drop_reference is None else unloaded_latency(drop_reference, light_latency(rounds, Z))
        est = estimate(rounds, biased, unloaded=unloaded, **KW)
        assert est is not None
        return est.overloaded

    assert overloaded(0.300, None) and not overloaded(0.300, reference)
    assert overloaded(1.2, reference)


def test_the_utilisation_curve_round_trips_and_rescales() -> None:
    curve = UtilisationCurve(0.01, 0.5, 4.0)
    assert curve.latency(0.0) == 0.01 and curve.latency(0.5) == math.inf
    assert curve.latency(0.25) == pytest.approx(0.01 / (1 - 0.5 ** 4))
    assert curve_from_dict(curve.to_dict()) == curve
    assert curve.scaled(2.0).latency(0.5) == pytest.approx(curve.latency(0.25))


def test_rounds_at_nearly_one_weight_keep_the_pools_prior_and_the_weight_they_carried() -> None:
    """A DIP relearning from three noisy rounds at 0.31-0.33 of the VIP, all near its unloaded 10 ms:
    on their own they fit a line through noise (s = 0.8 ms, a cap of 0.18); the pool's prior, which
    they do not reject, keeps its unloaded latency and a cap at the weight it carried."""
    cv = 1 / math.sqrt(20)  # twenty probes of exponential service
    rounds = [_round(t, w, mean, n=20, cv=cv) for t, w, mean in ((0, 0.315, 0.0081), (5, 0.328, 0.0150),
                                                                  (10, 0.314, 0.0090))]
    est = estimate(rounds, 0.010, **KW, floor=0.0625)
    assert est is not None and est.s == pytest.approx(0.010, rel=0.05)
    assert est.cap >= 0.31


def test_a_dips_own_rounds_at_distinct_loads_overrule_the_pools_prior() -> None:
    """An M/M/1 DIP of unloaded latency 25 ms (saturation 0.333) measured precisely at 0.05 and 0.15
    in a pool whose prior says 10 ms: its rounds reject the prior and give its own latency and knee."""
    rounds = [_round(0, w, 0.025 / (1 - w / 0.333), n=100) for w in (0.05, 0.15)]
    est = estimate(rounds, 0.010, **KW, floor=0.06)
    assert est is not None and est.s == pytest.approx(0.025, rel=0.01)
    assert est.saturation == pytest.approx(0.333, rel=0.02)


def test_a_dips_own_rounds_at_distinct_loads_tell_its_unloaded_latency_and_close_ones_do_not() -> None:
    """An M/M/1 DIP (10 ms unloaded, saturation 0.5) seen precisely at 0.1, 0.25 and 0.4 tells its
    unloaded latency; three noisy rounds a few percent of weight apart (the line through noise) tell none."""
    rounds = [_round(i, w, 0.010 / (1 - w / 0.5), n=400) for i, w in enumerate((0.1, 0.25, 0.4))]
    est = estimate(rounds, 0.030, **KW)
    assert est is not None and est.unloaded == pytest.approx(0.010, rel=0.02)
    cv = 1 / math.sqrt(20)
    close = [(0.315, 0.0081), (0.328, 0.0150), (0.314, 0.0090)]
    fits = shape_fits(np.asarray([w for w, _ in close]), np.asarray([m for _, m in close]),
                      np.asarray([(cv * m) ** 2 for _, m in close]))
    assert own_unloaded(fits, len(close), Z) is None
    noisy = estimate([_round(t, w, m, n=20, cv=cv) for t, (w, m) in enumerate(close)], 0.010, **KW)
    assert noisy is not None and noisy.unloaded is None


def test_a_dip_seen_at_one_weight_is_judged_by_its_own_unloaded_latency_when_the_pools_is_higher() -> None:
    """An M/M/1 DIP of 10 ms unloaded at 0.8 of its capacity (weight 0.2, saturation 0.25) relearned
    from rounds at that one weight: the pool's prior of 25 ms (a settled pool's lowest rounds are
    loaded ones) reads it as half busy, its saturation at 0.4, and its loosest cap grows past the
    weight it carries; the DIP's own unloaded latency, the lower of the two, puts the saturation at
    0.25 and every cap below it. Either prior stands when the other is not known."""
    rounds = [_round(t, 0.2, 0.010 / (1 - 0.8), n=100) for t in range(4)]
    pools = estimate(rounds, 0.025, **KW)
    own = estimate(rounds, own_prior(0.025, 0.010), **KW)
    assert pools is not None and own is not None
    assert pools.saturation == pytest.approx(0.4, rel=0.01) and pools.relaxed[-1] > 0.2
    assert own.saturation == pytest.approx(0.25, rel=0.01) and max(own.cap, *own.relaxed) < 0.25
    assert own_prior(0.010, 0.025) == 0.010
    assert own_prior(None, 0.012) == 0.012 and own_prior(0.012, None) == 0.012 and own_prior(None, None) is None
