"""The exact power of the two-sided paired t-test, and the minimum detectable effect (MDE) it gives.

With n pairs whose differences are normal with mean δ and std σ, the t statistic is noncentral t with
df = n − 1 and noncentrality λ = δ√n/σ, and the test at level α rejects when |T| > t_{1−α/2, df}:

    power(λ) = P(T' > t_c) + P(T' < −t_c),   P(T' ≤ t) = E[Φ(t·S − λ)],   S = √(V/df), V ~ χ²_df

(T' = (Z + λ)/S with Z standard normal). ``nct_cdf`` integrates the last expectation over the density of S
by Simpson's rule in float64; ``mde_lambda`` solves power(λ) = level (regula falsi), and the MDE is
λ · σ/√n. The usual approximation (t_{1−α/2} + t_power) · σ/√n replaces the noncentral t by a shifted
central one and has 73–79% power at 2–6 pairs where 80% is asked.

Plain Python (math only), like the rest of ``study/``.
"""
from __future__ import annotations

import math
from functools import lru_cache

#: Simpson intervals over S per unit of |t|·S (the width over which Φ(t·S − λ) turns), at least ``MIN_STEPS``:
#: the power's error is below 1e-8 for df = 1..1000 at α = 0.01-0.1 (measured against scipy.stats.nct: at most
#: 1.5e-9; tests/test_study_power.py)
PER_UNIT = 24
MIN_STEPS = 1600


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _s_max(df: int) -> float:
    """Beyond this S = √(V/df) has probability below 1e-20 (V ~ χ²_df; df = 1: a half-normal S, df = 2:
    P(S > s) = exp(−s²))."""
    return 10.0 if df == 1 else 8.0 if df == 2 else 1.0 + 12.0 / math.sqrt(df)


@lru_cache(maxsize=256)
def _nodes(df: int, steps: int) -> tuple[tuple[float, float], ...]:
    """Simpson nodes (s, weight × density of S at s) for ``df`` over ``steps`` (even) intervals."""
    c = 0.5 * df * math.log(df) - (0.5 * df - 1.0) * math.log(2.0) - math.lgamma(0.5 * df)
    top = _s_max(df)
    h = top / steps
    out = []
    for i in range(steps + 1):
        s = i * h
        if s == 0.0:
            dens = math.exp(c) if df == 1 else 0.0
        else:
            dens = math.exp(c + (df - 1) * math.log(s) - 0.5 * df * s * s)
        w = 1.0 if i in (0, steps) else (4.0 if i % 2 else 2.0)
        out.append((s, w * dens * h / 3.0))
    return tuple(out)


def nct_cdf(t: float, df: int, lam: float) -> float:
    """P(T' ≤ t) for the noncentral t with ``df`` degrees of freedom and noncentrality ``lam``."""
    steps = max(MIN_STEPS, 2 * math.ceil(PER_UNIT * _s_max(df) * abs(t) / 2))
    return sum(w * _phi(t * s - lam) for s, w in _nodes(df, steps))


def paired_t_power(lam: float, df: int, t_crit: float) -> float:
    """The probability that the two-sided test with critical value ``t_crit`` rejects at noncentrality ``lam``."""
    return 1.0 - nct_cdf(t_crit, df, lam) + nct_cdf(-t_crit, df, lam)


@lru_cache(maxsize=4096)
def mde_lambda(df: int, t_crit: float, level: float) -> float:
    """The noncentrality at which the two-sided paired t-test has power ``level`` (MDE = this · σ/√n): the
    root of power(λ) − level, bracketed and then found by regula falsi (Illinois), to |power − level| < 1e-13."""
    lo, hi = 0.0, max(1.0, t_crit)
    f_lo = paired_t_power(lo, df, t_crit) - level
    f_hi = paired_t_power(hi, df, t_crit) - level
    while f_hi < 0.0:
        lo, f_lo, hi = hi, f_hi, hi * 2.0
        f_hi = paired_t_power(hi, df, t_crit) - level
    side = 0
    mid = hi
    for _ in range(200):
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        f_mid = paired_t_power(mid, df, t_crit) - level
        if abs(f_mid) < 1e-13 or hi - lo < 1e-13 * hi:
            break
        if f_mid < 0.0:
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2.0
            side = -1
        else:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2.0
            side = 1
    return mid
