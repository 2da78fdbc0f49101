"""The report's "MDE at 80% power" is exact: the mean difference at which the two-sided paired t-test rejects
with probability 0.80 (``study/power.py``: noncentral t, integrated in float64). Checked against scipy's
noncentral t and against a simulation, and seeds_needed against a brute-force search."""
from __future__ import annotations

import math
import random

import pytest

from scalevec_lit.study import power, stats
from scalevec_lit.study.secondary import seeds_needed


def test_power_at_zero_effect_is_the_level():
    # λ = 0: the noncentral t is Student's t, so the power is α (up to the integration error, < 1e-8)
    for df in (1, 2, 3, 5, 11, 50, 300):
        for alpha in (0.01, 0.05, 0.1):
            tc = stats.t_ppf(1 - alpha / 2, df)
            assert power.paired_t_power(0.0, df, tc) == pytest.approx(alpha, abs=1e-8), (df, alpha)


def test_mde_has_exactly_the_asked_power_by_scipy():
    """scipy's noncentral t (an independent implementation) gives the power at the reported MDE. Tolerance
    1e-7: the root is found to |power − level| < 1e-13, the Simpson integral errs by at most 1.5e-9 (measured over
    df 1-1000, α 0.01-0.1) and scipy's nct by less than 1e-10; the approximation misses by 0.005 to 0.07."""
    nct = pytest.importorskip("scipy.stats").nct
    for n in (2, 3, 4, 5, 6, 8, 12, 30):
        df = n - 1
        for alpha, level in ((0.05, 0.8), (0.01, 0.8), (0.05, 0.9)):
            if (n, level) == (2, 0.9):  # λ = 21 at df = 1: scipy's nct returns nan there
                continue
            tc = stats.t_ppf(1 - alpha / 2, df)
            d = stats.detectable(0.7, n, alpha, level)
            lam = d["mde"] * math.sqrt(n) / 0.7
            exact = nct.sf(tc, df, lam) + nct.cdf(-tc, df, lam)
            assert exact == pytest.approx(level, abs=1e-7), (n, alpha, level, exact)
            old = stats.detectable(0.7, n, alpha, level, exact=False)["mde"] * math.sqrt(n) / 0.7
            if n <= 6 and (alpha, level) == (0.05, 0.8):  # the approximation the report used: 73-79%
                assert 0.72 < nct.sf(tc, df, old) + nct.cdf(-tc, df, old) < 0.795, n


def test_mde_power_by_simulation():
    """3 pairs of normal differences with mean = the MDE: the t-test rejects in 80% of 100,000 simulated
    studies (standard error √(0.8 · 0.2 / 1e5) = 0.0013; 4 standard errors allowed). The approximation's MDE
    would give 0.766, 26 standard errors away."""
    n, sd, alpha = 3, 1.0, 0.05
    mde = stats.detectable(sd, n, alpha)["mde"]
    tc = stats.t_ppf(1 - alpha / 2, n - 1)
    rng = random.Random(5)
    hits, draws = 0, 100_000
    for _ in range(draws):
        xs = [rng.gauss(mde, sd) for _ in range(n)]
        m = sum(xs) / n
        s = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
        hits += abs(m / (s / math.sqrt(n))) > tc
    assert abs(hits / draws - 0.8) < 4 * math.sqrt(0.8 * 0.2 / draws), hits / draws


def test_seeds_needed_is_the_fewest_with_the_exact_power():
    for sd, mde in ((0.023, 0.026), (0.033, 0.019), (0.34, 0.15), (0.01, 0.028)):
        brute = next(n for n in range(2, 1000) if stats.detectable(sd, n)["mde"] <= mde)
        assert seeds_needed(sd, mde) == brute
    # where the two differ: at 4 pairs the approximate MDE of sd 0.01 is 0.02080, the exact one 0.02128
    approx = lambda sd, mde: next(n for n in range(2, 100) if stats.detectable(sd, n, exact=False)["mde"] <= mde)
    assert (approx(0.01, 0.021), seeds_needed(0.01, 0.021)) == (4, 5)
    # ... and at 26 pairs of sd 0.033 the exact MDE (0.0188663) is a little below the approximate (0.0188704)
    assert (approx(0.033, 0.018868), seeds_needed(0.033, 0.018868)) == (27, 26)
    assert seeds_needed(1.0, 0.01, most=50) is None
