"""The verdict rule of ``benchmarks/compiled.py``: a time target is judged on a distribution-free 95%
confidence interval of the median per-round ratio (order statistics), not on the spread of single rounds."""
from __future__ import annotations

import random
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from compiled import median_ci, verdict  # noqa: E402


def test_the_interval_covers_the_median_at_its_level_and_narrows_with_rounds():
    rng = random.Random(0)
    for n in (20, 60, 100):
        covered = 0
        for _ in range(1000):
            lo, hi = median_ci([rng.gauss(1.0, 0.02) for _ in range(n)])
            covered += lo <= 1.0 <= hi
        assert covered >= 930, (n, covered)  # 95% nominal (conservative with ranks rounded outwards)
    width = {n: sum((lambda c: c[1] - c[0])(median_ci([rng.gauss(1.0, 0.02) for _ in range(n)]))
                    for _ in range(200)) for n in (25, 400)}
    assert width[400] < width[25] / 3  # ∝ 1/√n: 4× narrower in expectation


def test_verdicts():
    assert verdict((0.99, 1.015), 1.02).startswith("met")
    assert verdict((1.021, 1.03), 1.02).startswith("missed")
    assert verdict((1.01, 1.03), 1.02).startswith("unresolved")
    assert verdict((0.9, 1.1), None) == "—"
    xs = [1.0, 1.01, 1.02, 1.03]
    lo, hi = median_ci(xs)
    assert lo == min(xs) and hi == max(xs)  # four rounds cannot narrow it
