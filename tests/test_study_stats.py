"""The paired statistics of a study (``scalevec_lit.study.stats``): exact values on hand-computed inputs,
the Student-t interval's coverage, sign tests, diverged runs, and the best LR of a grid."""
from __future__ import annotations

import math
import random

import pytest

from scalevec_lit import study as st
from scalevec_lit.study import stats


def test_student_t_against_closed_forms():
    # df = 1 (Cauchy): p = 1 − (2/π)·atan|t|; df = 2: p = 1 − |t|/√(2 + t²); df = 2 quantile: (2q−1)/√(2q(1−q))
    assert stats.t_sf2(2.0, 1) == pytest.approx(1 - 2 / math.pi * math.atan(2.0), abs=1e-12)
    assert stats.t_sf2(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-12)
    assert stats.t_sf2(0.0, 5) == pytest.approx(1.0)
    assert stats.t_ppf(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), abs=1e-9)
    assert stats.t_ppf(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-8)  # 12.706
    assert stats.t_ppf(0.025, 2) == pytest.approx(-stats.t_ppf(0.975, 2))


def test_paired_t_sign_and_detectable_on_hand_values():
    var = {1: 1.1, 2: 1.3, 3: 1.2}
    ref = {1: 1.0, 2: 1.0, 3: 1.0}
    p = stats.paired(var, ref)
    # differences 0.1, 0.3, 0.2: mean 0.2, sd 0.1, t = 0.2 / (0.1/√3) = 2√3, df 2, p = 1 − t/√(2 + t²) = 1 − √(12/14)
    assert p["diffs"] == pytest.approx([0.1, 0.3, 0.2]) and p["n"] == 3
    assert p["mean"] == pytest.approx(0.2) and p["std"] == pytest.approx(0.1)
    assert p["t"] == pytest.approx(2 * math.sqrt(3)) and p["df"] == 2
    assert p["p_t"] == pytest.approx(1 - math.sqrt(12 / 14), abs=1e-12)
    assert (p["n_pos"], p["n_neg"], p["p_sign"]) == (3, 0, 0.25)
    t975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    t80 = 0.6 / math.sqrt(2 * 0.8 * 0.2)
    assert p["significant"] == pytest.approx(t975 * 0.1 / math.sqrt(3), rel=1e-9)
    # the MDE has exactly 80% power (tests/test_study_power.py); the usual approximation is smaller at 3 pairs
    from scalevec_lit.study.power import mde_lambda, paired_t_power

    assert p["mde"] == pytest.approx(mde_lambda(2, t975, 0.8) * 0.1 / math.sqrt(3), rel=1e-12)
    assert paired_t_power(p["mde"] * math.sqrt(3) / 0.1, 2, t975) == pytest.approx(0.8, abs=1e-9)
    assert p["mde"] > (t975 + t80) * 0.1 / math.sqrt(3) == pytest.approx(
        stats.detectable(0.1, 3, exact=False)["mde"], rel=1e-12)
    assert stats.verdict(p, "higher") == "not resolved"  # p = 0.074 > 0.05


def test_sign_test_exact_p_values():
    assert stats.sign_test(8, 0) == 2 / 256 == stats.min_sign_p(8)
    assert stats.sign_test(7, 1) == pytest.approx(2 * 9 / 256)
    assert stats.sign_test(1, 7) == stats.sign_test(7, 1)
    assert stats.sign_test(3, 0) == 0.25 and stats.sign_test(2, 1) == 1.0 and stats.sign_test(0, 0) == 1.0
    assert stats.sign_test(5, 5) == 1.0


def test_bootstrap_ci_exact_for_small_n_and_ordered():
    # n = 2: the 4 equally likely resamples have means 1, 2, 2, 3; linear quantiles at 2.5% and 97.5%
    assert stats.bootstrap_ci([1.0, 3.0]) == pytest.approx((1.075, 2.925))
    xs = [0.10, 0.30, 0.20]
    lo, hi = stats.bootstrap_ci(xs)  # 27 resamples, enumerated
    assert min(xs) <= lo < sum(xs) / 3 < hi <= max(xs)
    shifted = stats.bootstrap_ci([x + 1.0 for x in xs])
    assert shifted == pytest.approx((lo + 1.0, hi + 1.0))
    big = [0.01 * ((7 * i) % 11) - 0.02 for i in range(12)]  # 12^12 resamples: random, seeded
    a, b = stats.bootstrap_ci(big, n_boot=2000), stats.bootstrap_ci(big, n_boot=2000)
    assert a == b and a[0] < sum(big) / 12 < a[1]
    narrow = stats.bootstrap_ci(big, alpha=0.5, n_boot=2000)
    assert a[0] <= narrow[0] < narrow[1] <= a[1]


def test_paired_ci_holds_its_level_at_two_three_and_five_seeds():
    """The paired comparison's 95% interval covers the true mean difference of normal differences in at least
    93% of 2000 simulated studies at n = 2, 3 and 5 (exactly 95% in expectation for the Student-t interval;
    the binomial spread of 2000 draws is 0.5%). The percentile bootstrap it replaced covers about 50% at
    n = 2 and 68% at n = 3."""
    rng = random.Random(23)
    for n in (2, 3, 5):
        hits = 0
        for _ in range(2000):
            var = {s: rng.gauss(0.3, 0.7) for s in range(n)}
            p = stats.paired(var, dict.fromkeys(range(n), 0.0))
            lo, hi = p["ci"]
            hits += lo <= 0.3 <= hi
        assert hits / 2000 >= 0.93, (n, hits)
        assert p["ci_method"] == "Student-t"
    assert all(math.isnan(x) for x in stats.t_ci([1.0]))  # no interval from one pair
    assert stats.t_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)  # equal differences: the mean itself


def test_paired_with_diverged_runs_and_verdicts():
    nan = float("nan")
    p = stats.paired({1: nan, 2: 5.0, 3: 5.2, 4: 5.3}, {1: 5.0, 2: 4.9, 3: 5.0, 4: nan})
    assert p["n"] == 2 and p["diverged"] == 2 and p["n_pairs"] == 4
    assert (p["n_pos"], p["n_neg"]) == (3, 1)  # variant diverged: worse; reference diverged: better
    clear = stats.paired({s: 3.0 - 0.1 + 0.001 * s for s in range(1, 9)}, {s: 3.0 for s in range(1, 9)})
    assert stats.verdict(clear, "lower", test="sign") == "holds" == stats.verdict(clear, "lower")
    assert stats.verdict(clear, "higher", test="sign") == "against"
    u = stats.unpaired([2.90, 2.92, 2.91], [3.00, 3.02, 3.01])
    assert u["diff"] == pytest.approx(-0.10) and u["separable"]


def test_best_lr_and_grid_edge():
    assert stats.best_lr({0.001: [3.0, 3.2], 0.003: [2.9, 3.0], 0.01: [2.95, float("nan")]}) == 0.003
    assert stats.best_lr({0.01: [float("nan")]}) is None
    from scalevec_lit.study.grid import Grid

    runs = {st.Run("a", lr, s): {"endpoint": e} for (lr, s, e) in
            [(0.001, 1, 3.0), (0.001, 2, 3.1), (0.01, 1, 2.8), (0.01, 2, 2.9)]}
    g = Grid(runs, ["a"])
    assert g.best["a"] == 0.01 and g.at_edge("a")
