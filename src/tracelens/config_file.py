"""The config file: which rules run, their severities and settings, the logs' time zone, host aliases.

Looked for, first found wins: `--config FILE`; then in the run folder, then in the current
directory, a `tracelens.toml` or a `pyproject.toml` with a `[tool.tracelens]` table. The same keys
in both (in pyproject.toml under `tool.tracelens`):

    select = ["TL1", "TL4"]          # rule ids or prefixes; the command line's --select wins
    ignore = ["TL305"]
    tz = "Europe/Berlin"             # the zone of log times printed without one; --tz wins
    [severity]
    TL503 = "warning"                # info, warning or critical, for every finding of the rule
    [rules.TL203]
    wait_warns = 0.10                # a setting `tracelens rules TL203` lists
    [steps]
    slow_ratio = 2.0                 # what makes a step slow, for every rule and the report (SHARED_SETTINGS)
    sustained_ratio = 1.5
    [baseline]
    rise = 2.0                       # when a signal rose in a slow window (TL402, TL410)
    [packets]
    duplicate_ms = 0.1               # the capture analysis's windows (TL3xx, TL410, TL411, TL423)
    [hosts]
    "ip-10-0-0-1" = "node01"         # a host name as the inputs give it = the name to report

An unknown key, rule, setting or severity, or a value of the wrong type, is an error that names
the file and the key (ConfigError).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import polars as pl

from tracelens.derived import SHARED, Shared
from tracelens.derived.step_times import SlowSteps
from tracelens.discover import CONFIG_FILES
from tracelens.findings import Severity
from tracelens.rules import Rule, Setting, all_rules
from tracelens.small_read import TooBig, read_small
from tracelens.tables import SCHEMAS, RunTables

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FILE_NAME = CONFIG_FILES[0]
MAX_BYTES = 1 << 20  # a config file is a few lines
KEYS = ("select", "ignore", "tz", "severity", "rules", *SHARED, "hosts")


@dataclass(frozen=True)
class SharedSettings:
    """One group of shared settings ([steps], [baseline], [packets], each a table of the config file):
    its settings (the defaults are those of the RunContext's Shared), a title, and which rules read it
    (for `tracelens rules ID`)."""

    title: str
    readers: str
    settings: tuple[Setting, ...]


def _shared_settings(
    name: str, title: str, readers: str, described: dict[str, tuple[str, str]], **bounds: float
) -> SharedSettings:
    """The description of Shared's field `name`: every field of its dataclass, described (unit, sentence)."""
    defaults = getattr(Shared(), name)
    names = [f.name for f in fields(defaults)]
    if set(names) != set(described):
        raise ValueError(f"[{name}]: settings {names} must all be described, no more ({sorted(described)})")
    settings = tuple(Setting(*described[n], n, getattr(defaults, n), bounds.get(n)) for n in names)
    return SharedSettings(title, readers, settings)


# The settings of results several rules share: each is one table of the config file, validated like
# a rule's settings, and read from the RunContext (ctx.shared) by every rule and report section.
SHARED_SETTINGS = {
    "steps": _shared_settings(
        "steps",
        "Slow steps",
        "reads steps",
        {
            "slow_ratio": (
                "times the usual step time",
                "A step slower than this multiple of its log's rolling median step time ...",
            ),
            "slow_sigmas": (
                "robust standard deviations",
                "... and this many robust standard deviations above it is slow "
                "(TL401 reports its windows; TL402, TL410, TL601 and the report read them).",
            ),
            "sustained_ratio": (
                "times the log's fast quartile",
                "A stretch the rolling median absorbs is slow where its steps are slower "
                "than this multiple of the log's fast quartile ...",
            ),
            "sustained_steps": ("logged steps", "... for at least this many logged steps in a row."),
            "min_cost_share": (
                "share of the run's step time",
                "A slow stretch, or TL401's isolated spikes together, costing less than this is not reported.",
            ),
        },
    ),
    "baseline": _shared_settings(
        "baseline",
        "Baseline test",
        "judges a slow window against the rest of the run",
        {
            "confidence": (
                "probability",
                "The confidence of the lower bound of a count's rate in a slow window over its rate "
                "in the rest of the run (retransmissions, NAKs, counter rises, NCCL warnings) ...",
            ),
            "rise": (
                "times the rate outside the window",
                "... and a count rose in the window when that bound is at least this multiple.",
            ),
            "level_rise": (
                "times the level outside the window",
                "A rank's per-step time (compute, communication, between steps) rose when its median "
                "in the window is at least this multiple of its median outside ...",
            ),
            "level_sigmas": (
                "robust standard deviations",
                "... and at least this many robust standard deviations of the steps outside above it.",
            ),
        },
        confidence=1.0,
    ),
    "packets": _shared_settings(
        "packets",
        "Packet windows",
        "reads packets",
        {
            "duplicate_ms": (
                "milliseconds",
                "A frame with the IP id and transport bytes of the previous frame in its direction, "
                "this soon after it, is the same packet captured twice (TL305), not a retransmission.",
            ),
            "out_of_order_ms": (
                "milliseconds",
                "A TCP segment below the highest sequence sent, this soon after it, is out of order rather "
                "than retransmitted, where the capture lacks the handshake that gives the round-trip time.",
            ),
            "fast_retransmission_ms": (
                "milliseconds",
                "A resend this soon after the receiver's duplicate ACKs is a fast retransmission.",
            ),
        },
    ),
}
assert tuple(SHARED_SETTINGS) == SHARED
TYPE_NAMES = {
    float: "a number",
    int: "a whole number",
    bool: "true or false",
    str: "a string",
    tuple: "a list of whole numbers",
}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Config:
    """What a config file says (empty: every default)."""

    source: Path | None = None  # the file it came from
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    tz: str | None = None
    severity: dict[str, Severity] = field(default_factory=dict)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # rule id -> setting -> value
    hosts: dict[str, str] = field(default_factory=dict)
    shared: Shared = Shared()  # the [steps], [baseline] and [packets] tables

    @property
    def slow_steps(self) -> SlowSteps:
        """What makes a step slow (the [steps] table)."""
        return self.shared.steps

    @property
    def label(self) -> str:
        """How the reports name it: `runs/run42/tracelens.toml`, `[tool.tracelens] in pyproject.toml`, or none."""
        if self.source is None:
            return "none (defaults)"
        table = "[tool.tracelens] in " if self.source.name == "pyproject.toml" else ""
        return f"{table}{self.source}"


def find(*runs: Path, cwd: Path | None = None) -> Path | None:
    """The config file for `runs`: in each run's folder (the folder of a run file or archive), then in `cwd`."""
    folders = [*(run if run.is_dir() else run.parent for run in runs), cwd or Path.cwd()]
    for folder in folders:
        for name in CONFIG_FILES:
            path = folder / name
            if path.is_file() and (name == FILE_NAME or _tool_table(path) is not None):
                return path
    return None


def load(path: Path | None) -> Config:
    """Read and check the config at `path` (None: the defaults)."""
    if path is None:
        return Config()
    data = _tool_table(path) if path.name == "pyproject.toml" else _read(path)
    if data is None:
        raise ConfigError(f"{path}: no [tool.tracelens] table")
    prefix = "tool.tracelens." if path.name == "pyproject.toml" else ""
    return _parse(path, data, prefix)


# Columns besides `host` that name hosts, and the separator of those that list several.
HOST_COLUMNS: dict[str, dict[str, str | None]] = {"nccl_errors": {"peer": None}, "nccl_tests": {"rank_hosts": ","}}
HOST_LISTS = {"inputs": ", "}  # the inputs table's `host` lists every host a file named


def rename_hosts(tables: RunTables, aliases: dict[str, str]) -> RunTables:
    """New tables whose host names are renamed by `aliases` (the config's [hosts]) wherever a table
    names a host, so findings, report sections and the diff all use the alias."""
    if not aliases:
        return tables
    renamed = RunTables()
    for name in SCHEMAS:
        if name not in tables:
            continue
        frame = tables.frame(name)  # a spilled table stays lazy: renamed as it is read or written
        columns = {"host": HOST_LISTS.get(name), **HOST_COLUMNS.get(name, {})}
        for column, sep in columns.items():
            if column in frame.collect_schema().names():
                col = pl.col(column)
                if sep is None:
                    new = col.replace(aliases)
                else:
                    new = col.str.split(sep).list.eval(pl.element().replace(aliases)).list.join(sep)
                frame = frame.with_columns(new.alias(column))
        renamed.add(name, frame)
    return renamed


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(read_small(path, MAX_BYTES, "config file").decode("utf-8"))
    except (OSError, UnicodeDecodeError, TooBig) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from err


def _tool_table(path: Path) -> dict[str, Any] | None:
    table = _read(path).get("tool", {}).get("tracelens")
    return table if isinstance(table, dict) else None


def _parse(path: Path, data: dict[str, Any], prefix: str) -> Config:
    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: {prefix}{key}: {why}")

    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise fail(unknown[0], f"unknown key (known: {', '.join(KEYS)})")
    rules = {r.id: r for r in all_rules()}
    select, ignore = (_rule_list(data.get(k, []), rules, lambda why, k=k: fail(k, why)) for k in ("select", "ignore"))
    tz = data.get("tz")
    if tz is not None:
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError) as err:
            raise fail("tz", f"{tz!r} is not a time zone name (e.g. Europe/Berlin, UTC)") from err
    severity = {}
    for rule_id, label in _table(data, "severity", fail).items():
        if rule_id not in rules:
            raise fail(f"severity.{rule_id}", "unknown rule (`tracelens rules` lists them)")
        try:
            severity[rule_id] = Severity.parse(label)
        except (KeyError, AttributeError) as err:
            raise fail(f"severity.{rule_id}", f"{label!r} is not info, warning or critical") from err
    settings = {}
    for rule_id, values in _table(data, "rules", fail).items():
        if rule_id not in rules:
            raise fail(f"rules.{rule_id}", "unknown rule (`tracelens rules` lists them)")
        settings[rule_id] = _values(
            rule_id, rules[rule_id].settings, values, lambda key, why, r=rule_id: fail(f"rules.{r}{key}", why)
        )
    shared = Shared(
        **{
            name: replace(
                getattr(Shared(), name),
                **_values(name, group.settings, _table(data, name, fail), lambda k, why, n=name: fail(f"{n}{k}", why)),
            )
            for name, group in SHARED_SETTINGS.items()
        }
    )
    hosts = _table(data, "hosts", fail)
    for name, alias in hosts.items():
        if not isinstance(alias, str) or not alias.strip():
            raise fail(f"hosts.{name}", f"{alias!r} is not a host name (a string)")
    return Config(path, select, ignore, tz, severity, settings, dict(hosts), shared)


def _table(data: dict[str, Any], key: str, fail) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise fail(key, "must be a table")
    return value


def _rule_list(value: Any, rules: dict[str, Rule], fail) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail('must be a list of rule ids or prefixes, e.g. ["TL1", "TL305"]')
    chosen = [v.strip().upper() for v in value]
    for v in chosen:
        if not v or not any(r.startswith(v) for r in rules):
            raise fail(f"{v!r} matches no rule (`tracelens rules` lists them)")
    return chosen


def _values(owner: str, settings: tuple[Setting, ...], values: Any, fail) -> dict[str, Any]:
    """The values the file gives to `settings` (of a rule, or [steps]), each checked against the type of its default."""
    if not isinstance(values, dict):
        raise fail("", "must be a table of settings")
    known = {s.name: s for s in settings}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            names = ", ".join(known) or "none"
            raise fail(f".{name}", f"unknown setting (the settings of {owner}: {names})")
        default = known[name].default
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(default, tuple):  # a list of whole numbers (TL605's Xids)
            whole = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            if not whole or any(v < 0 for v in value):
                raise fail(f".{name}", f"{value!r} is not a list of whole numbers of 0 or more, like {list(default)}")
            out[name] = tuple(value)
            continue
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            ok = type(value) is type(default)
        else:
            ok = number and (isinstance(default, float) or isinstance(value, int))
        if not ok:
            raise fail(
                f".{name}", f"{value!r} is not {TYPE_NAMES.get(type(default), 'a value')} like the default {default!r}"
            )
        if number and not 0 <= value < math.inf:  # every threshold is a count, share, ratio or size
            raise fail(f".{name}", f"{value!r} is not a finite number of 0 or more")
        below = known[name].below
        if below is not None and value >= below:
            raise fail(f".{name}", f"{value!r} is not below {below:g}")
        out[name] = float(value) if isinstance(default, float) else value
    return out
