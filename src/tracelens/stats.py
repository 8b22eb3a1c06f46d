"""Small, exact statistical tests for evidence: is a rate or a distribution really different?

Standard library only (no SciPy): the sample sizes here are step counts and event counts, and the
tests are simple enough to write out, so a reader can check every number a finding quotes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): the regularized incomplete beta I_p(k, n - k + 1)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return _betainc(k, n - k + 1, p)


def binomial_pmf(x: int, n: int, pi: float) -> float:
    """P(X = x) for X ~ Binomial(n, pi)."""
    if pi >= 1.0:
        return 1.0 if x == n else 0.0
    log = (
        math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * math.log(pi) + (n - x) * math.log1p(-pi)
    )
    return math.exp(log)


def _betainc(a: float, b: float, z: float) -> float:
    """The regularized incomplete beta function I_z(a, b) (Lentz's continued fraction)."""
    if z <= 0.0:
        return 0.0
    if z >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(z) + b * math.log1p(-z))
    if z > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - z)
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(0, 10_000):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = (m * (b - m) * z) / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -((a + m) * (a + b + m) * z) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        cd = c * d
        f *= cd
        if abs(1.0 - cd) < 1e-14:
            break
    return front * (f - 1.0) / a


def rate_rise_p(count: int, exposure: float, base_count: int, base_exposure: float) -> float:
    """One-sided p-value that the rate `count / exposure` exceeds `base_count / base_exposure`.

    The conditional test for two Poisson rates: given the total number of events, the share that
    fell in the first exposure is binomial with p = exposure / (exposure + base_exposure) when
    the rates are equal. So 3 events against a baseline of 0 over the same time is not
    significant (p = 0.125), while 300 against 100 is.
    """
    if exposure <= 0 or base_exposure <= 0:
        return 1.0
    total = count + base_count
    return binomial_sf(count, total, exposure / (exposure + base_exposure))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected) that
    samples `a` and `b` come from the same distribution; 1.0 when either has fewer than 3 values."""
    n1, n2 = len(a), len(b)
    if n1 < 3 or n2 < 3:
        return 1.0
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks_a = 0.0
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2 + 1
        size = j - i + 1
        ties += size**3 - size
        ranks_a += rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = ranks_a - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
