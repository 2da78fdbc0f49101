"""Statistics of a study, plain Python (no numpy, no scipy): paired t, sign test, bootstrap CI, the
smallest detectable effect, and the best learning rate of a variant."""
from __future__ import annotations

import math
import random
from itertools import product
from typing import Optional


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
