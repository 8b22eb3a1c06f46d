"""Is a signal higher inside a slow window than in the same run outside it? The two tests the
verdict (rules.correlate) uses, one for counts and one for levels.

Counts (retransmissions, NAKs, counter rises, NCCL warnings): events in the window (x over t_in
seconds) against events outside it (y over t_out) are compared with the exact conditional test
for two Poisson rates: given n = x + y events, x is Binomial(n, pi) with pi = R t_in / (R t_in +
t_out), where R is the ratio of the window's rate to the baseline's. The one-sided 95% lower
confidence bound of R comes from the mid-p binomial tail (Lancaster's mid-p: the exact test
made less conservative by counting half the probability of the observed count). A count *rose*
when that bound is at least `rise`: the window's rate is, with 95% confidence, at least 1.5x the
baseline's. So 3 events in a minute against none in the ten minutes before rise (bound 7.8x),
while 300 against 280 in the same time do not (bound 0.93x), and 3 against none over equal
times do not either (bound 1.2x).

Levels (per-step compute or communication time of one rank): the median inside against the
median outside; a level rose when the ratio is at least `level_rise` and the difference is at
least `level_sigmas` robust standard deviations (1.4826 x the median absolute deviation) of the
steps outside, so that a noisy timer does not rise on noise.

The four thresholds are a Baseline (a config file's [baseline] table, the RunContext's
`baseline`): every window signal TL402 and TL410 judge is judged by the same test.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tracelens.stats import binomial_pmf, binomial_sf

EXACT_MAX = 20_000  # more events than this: the normal approximation of log R is exact enough


@dataclass(frozen=True)
class Baseline:
    """When a signal rose above the run's own level outside the window (a config's [baseline])."""

    confidence: float = 0.95  # of the lower bound of a count's rate ratio
    rise: float = 1.5  # the window's rate must be at least this multiple of the baseline's (lower bound)
    level_rise: float = 1.3  # a per-step time this much above its level outside the window ...
    level_sigmas: float = 3.0  # ... and this many robust standard deviations above it


@dataclass(frozen=True)
class RateComparison:
    """One count signal in a window against the same signal outside it."""

    inside: int
    inside_s: float
    outside: int
    outside_s: float
    limits: Baseline = Baseline()

    @property
    def rate_in(self) -> float:
        return self.inside / self.inside_s if self.inside_s > 0 else 0.0

    @property
    def rate_out(self) -> float:
        return self.outside / self.outside_s if self.outside_s > 0 else 0.0

    @functools.cached_property
    def ratio_lower(self) -> float:
        """The one-sided lower confidence bound (95% by default) of rate_in / rate_out (inf when
        nothing is outside and the bound is unbounded; 0 when nothing is inside)."""
        return rate_ratio_lower(self.inside, self.inside_s, self.outside, self.outside_s, self.limits.confidence)

    @property
    def comparable(self) -> bool:
        """Whether there is a window and a baseline to compare at all."""
        return self.inside_s > 0 and self.outside_s > 0

    @property
    def rose(self) -> bool:
        return self.comparable and self.inside > 0 and self.ratio_lower >= self.limits.rise


def rate_ratio_lower(x: int, t_in: float, y: int, t_out: float, confidence: float = Baseline.confidence) -> float:
    """Lower confidence bound of the rate ratio (x / t_in) / (y / t_out), mid-p exact (see the module doc)."""
    if x <= 0 or t_in <= 0 or t_out <= 0:
        return 0.0
    alpha = 1.0 - confidence
    n = x + y
    if n > EXACT_MAX:
        z = _normal_quantile(confidence)
        return (x / t_in) / (max(y, 0.5) / t_out) * math.exp(-z * math.sqrt(1 / x + 1 / max(y, 0.5)))
    lo, hi = 0.0, 1.0
    if _mid_p_upper(x, n, hi - 1e-15) < alpha:
        return 0.0
    for _ in range(100):  # bisection on pi: the mid-p upper tail grows with pi
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break  # lo and hi are adjacent floats: no later step would move either (the same pi, in ~60 steps)
        if _mid_p_upper(x, n, mid) < alpha:
            lo = mid
        else:
            hi = mid
    pi = (lo + hi) / 2
    if pi >= 1.0 - 1e-12:
        return math.inf
    return pi * t_out / ((1 - pi) * t_in)


def _mid_p_upper(x: int, n: int, pi: float) -> float:
    """P(X > x) + P(X = x) / 2 for X ~ Binomial(n, pi)."""
    if pi <= 0.0:
        return 0.0
    return binomial_sf(x, n, pi) - 0.5 * binomial_pmf(x, n, pi)


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (bisection on erf; only used for very large counts)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class LevelComparison:
    """One per-step level (a rank's compute or communication time) inside a window against outside it."""

    inside: float | None  # medians, ms
    outside: float | None
    spread: float  # robust standard deviation of the steps outside
    steps_in: int
    steps_out: int
    min_in: int = 1  # steps inside it takes to compare (a median of one or two steps is no level; one pause is a mean)
    limits: Baseline = Baseline()

    @property
    def ratio(self) -> float | None:
        return self.inside / self.outside if self.inside is not None and self.outside else None

    @property
    def comparable(self) -> bool:
        return (
            self.inside is not None
            and self.outside is not None
            and self.steps_out >= 3
            and self.steps_in >= self.min_in
        )

    @property
    def rose(self) -> bool:
        ratio, inside, outside = self.ratio, self.inside, self.outside
        if not self.comparable or ratio is None or inside is None or outside is None:
            return False
        return ratio >= self.limits.level_rise and inside - outside >= self.limits.level_sigmas * self.spread

    @property
    def fell(self) -> bool:
        """The mirror of `rose`: the level fell as far below its level outside (a straggler's wait)."""
        ratio, inside, outside = self.ratio, self.inside, self.outside
        if not self.comparable or ratio is None or inside is None or outside is None:
            return False
        return ratio * self.limits.level_rise <= 1 and outside - inside >= self.limits.level_sigmas * self.spread
