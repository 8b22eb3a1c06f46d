"""What stands before a tool's own line once launchers, test runners and log shippers have passed
it on: the shared part of the parsers' line envelopes, for the formats whose lines must be
matched from their start (a result row is only numbers, so it cannot be found anywhere in a line).

In the order they are added, outermost first:
- a log shipper's time: a CloudWatch console table `| 2024-12-04T05:27:42.076Z | `, or a leading
  `2019-06-02T16:13:44.884Z: ` / `2024-12-04 05:27:43.123456 `;
- a runner's or pdsh's host: `gpu-node-7 [stderr] `, `worker-0: `;
- Open MPI's --tag-output `[1,12]<stdout>:`.
"""

from __future__ import annotations

_SHIPPER_TIME = (
    r"(?:\|\s*\d{4}-\d\d-\d\d[T ][\d:.,]+Z?\s*\|\s?"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?:? )"
)
_HOST = r"(?:[\w.-]+ \[std(?:out|err)\] |[\w.-]+: )"
_OPEN_MPI = r"\[\d+,\d+\]<std(?:out|err)>:"

LAUNCHER_PREFIX = f"{_SHIPPER_TIME}?{_HOST}?(?:{_OPEN_MPI})?"
"""A regex (no groups, not anchored) for any of these layers, each optional."""
