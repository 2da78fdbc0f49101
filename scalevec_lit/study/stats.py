"""Statistics of a study, plain Python (no numpy, no scipy): paired t, sign test, the Student-t confidence
interval of the paired mean (``t_ci``; the percentile bootstrap, ``bootstrap_ci``, under-covers at the few
seeds a study has: about 68% at 3 and 50% at 2 for a nominal 95%), the smallest detectable effect, and the
best learning rate of a variant."""
from __future__ import annotations

import math
import random
from functools import lru_cache
from itertools import product
from typing import Optional

from .power import mde_lambda


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; NaN for one value)."""
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def best_lr(endpoints: dict[float, list[float]]) -> Optional[float]:
    """The LR with the lowest mean endpoint (``{lr: [endpoint per seed]}``); ties: the smaller LR."""
    usable = {lr: v for lr, v in endpoints.items() if v and all(math.isfinite(x) for x in v)}
    if not usable:
        return None
    return min(sorted(usable), key=lambda lr: sum(usable[lr]) / len(usable[lr]))


# -- Student's t distribution (regularized incomplete beta, Lentz's continued fraction) -------------------
def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided p-value of Student's t: P(|T| >= |t|) with ``df`` degrees of freedom."""
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=256)
def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (q in (0, 1)), by bisection on the CDF."""
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    target = 2.0 * (1.0 - q)  # two-sided tail mass at the quantile
    lo, hi = 0.0, 1.0
    while t_sf2(hi, df) > target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf2(mid, df) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


# -- tests on paired differences ----------------------------------------------------------------------------
def sign_test(n_pos: int, n_neg: int) -> float:
    """Exact two-sided sign test p-value: P(a count at least as far from n/2 as observed), n = n_pos + n_neg
    (ties dropped before), Binomial(n, 1/2); 1.0 when n = 0."""
    n = n_pos + n_neg
    if n == 0:
        return 1.0
    k = min(n_pos, n_neg)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2.0 * tail)


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default method)."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (pos - lo) * (sorted_xs[hi] - sorted_xs[lo])


def bootstrap_ci(xs: list[float], alpha: float = 0.05, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean. With n^n <= ``n_boot`` resamples possible, every resample is
    enumerated (exact, no randomness); else ``n_boot`` resamples from a seeded generator. Not used by
    ``paired``: at small n it covers far less than its nominal level (``t_ci`` holds it)."""
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    if n ** n <= n_boot:
        means = sorted(sum(c) / n for c in product(xs, repeat=n))
    else:
        rng = random.Random(seed)
        means = sorted(sum(rng.choice(xs) for _ in range(n)) / n for _ in range(n_boot))
    return quantile(means, alpha / 2.0), quantile(means, 1.0 - alpha / 2.0)


#: how ``paired`` computes its ``ci`` (the report names it)
CI_METHOD = "Student-t"


def t_ci(xs: list[float], alpha: float = 0.05) -> tuple[float, float]:
    """The Student-t ``1 − alpha`` confidence interval of the mean, ``m ± t_{1−α/2, n−1} · s / √n``: exact
    coverage for normally distributed values at any n ≥ 2 (NaN below; ``(m, m)`` when all values are equal)."""
    n = len(xs)
    if n < 2:
        return float("nan"), float("nan")
    m, sd = mean_std(xs)
    half = t_ppf(1.0 - alpha / 2.0, n - 1) * sd / math.sqrt(n)
    return m - half, m + half


def detectable(sd: float, n: int, alpha: float = 0.05, power: float = 0.8, exact: bool = True) -> dict:
    """For a paired t-test with ``n`` pairs and paired std ``sd``: the smallest mean difference that would
    be significant (``significant``: t_{1-α/2}·sd/√n) and the one detected with probability ``power``
    (``mde``: λ·sd/√n with λ the noncentrality at which the two-sided test has exactly that power,
    ``power.py``; ``exact=False``: the usual approximation (t_{1-α/2} + t_power)·sd/√n, which has 73-79%
    power at 2-6 pairs where 80% is asked)."""
    if n < 2 or not math.isfinite(sd):
        return {"significant": float("nan"), "mde": float("nan")}
    df = n - 1
    se = sd / math.sqrt(n)
    t_a = t_ppf(1.0 - alpha / 2.0, df)
    lam = mde_lambda(df, t_a, power) if exact else t_a + t_ppf(power, df)
    return {"significant": t_a * se, "mde": lam * se}


def paired(var: dict, ref: dict, alpha: float = 0.05) -> dict:
    """Paired comparison of ``{key: endpoint}`` dicts (key = seed or (lr, seed)): differences var − ref on
    the common keys. A non-finite endpoint (a diverged run) is left out of the mean, t and CI; in the sign
    test it counts as the worse side (both non-finite: a tie)."""
    keys = sorted(set(var) & set(ref))
    diffs, pos, neg = [], 0, 0
    for k in keys:
        a, b = var[k], ref[k]
        fa, fb = math.isfinite(a), math.isfinite(b)
        if fa and fb:
            d = a - b
            diffs.append(d)
            pos += d > 0
            neg += d < 0
        elif fa != fb:
            pos += not fa  # the variant diverged: worse
            neg += not fb
    n = len(diffs)
    out = {"keys": keys, "diffs": diffs, "n": n, "n_pairs": len(keys), "n_pos": pos, "n_neg": neg,
           "p_sign": sign_test(pos, neg), "diverged": len(keys) - n}
    m, sd = mean_std(diffs) if diffs else (float("nan"), float("nan"))
    out.update(mean=m, std=sd)
    if n >= 2 and sd > 0:
        t = m / (sd / math.sqrt(n))
        out.update(t=t, df=n - 1, p_t=t_sf2(t, n - 1))
    elif n >= 2:  # identical differences: t is infinite unless they are all zero
        out.update(t=float("inf") if m else 0.0, df=n - 1, p_t=0.0 if m else 1.0)
    else:
        out.update(t=float("nan"), df=0, p_t=float("nan"))
    out["ci"] = t_ci(diffs, alpha)  # CI_METHOD
    out["ci_method"] = CI_METHOD
    out.update(detectable(sd, n, alpha))
    return out


def min_sign_p(n: int) -> float:
    """The smallest two-sided sign-test p-value possible with ``n`` pairs (all of one sign)."""
    return sign_test(n, 0) if n else 1.0


def verdict(p: dict, expect: str, alpha: float = 0.05, test: str = "t") -> str:
    """``holds`` / ``against`` / ``not resolved`` for a paired comparison and the expected direction
    (``lower`` or ``higher`` loss of the variant), by the paired t-test (``t``) or the sign test (``sign``)."""
    if test == "sign":
        pval, direction = p["p_sign"], p["n_pos"] - p["n_neg"]
    else:
        pval, direction = p.get("p_t", float("nan")), p["mean"]
    if not (isinstance(pval, float) and math.isfinite(pval)) or pval >= alpha or direction == 0:
        return "not resolved"
    agrees = direction < 0 if expect == "lower" else direction > 0
    return "holds" if agrees else "against"


def unpaired(var: list[float], ref: list[float], separation: float = 2.0) -> dict:
    """The secondary, unpaired view: difference of means, pooled seed std, |diff| > separation × pooled."""
    var = [x for x in var if math.isfinite(x)]
    ref = [x for x in ref if math.isfinite(x)]
    if not var or not ref:
        return {"diff": float("nan"), "pooled": float("nan"), "separable": False}
    mv, sv = mean_std(var)
    mr, sr = mean_std(ref)
    pooled = math.sqrt((sv ** 2 + sr ** 2) / 2) if math.isfinite(sv + sr) else float("nan")
    return {"diff": mv - mr, "pooled": pooled, "separable": math.isfinite(pooled) and abs(mv - mr) > separation * pooled}
