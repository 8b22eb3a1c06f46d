"""The RunContext: the aligned tables of one run and what several rules and report sections
derive from them, each computed once, on first use.

Stages import one way: tables -> ingest -> timeline -> derived -> rules -> report. A module in
this package reads tables (and other derived results) and never a rule or a report section.

How a rule uses it (tracelens.rules): a rule is a function of the context, registered with
`@rule`, which declares what the rule needs and its settings::

    @rule("TL401", "step-time-spikes", Severity.WARNING, kind="symptom", needs=("steps",),
          settings={"critical_share": Setting("share of the run's step time", "A stretch costing more is critical.")})
    def step_time_spikes(ctx: RunContext, *, critical_share: float = 0.2) -> Iterator[Finding]:
        windows = ctx.slow_windows          # computed once for every rule and section that asks
        rows = ctx["comm_ops"]              # an aligned table, same as ctx.tables["comm_ops"]
        hosts = ctx.scan("nccl_events").select("host").unique().collect()  # a big table: only what is shown
        for frame in ctx.step_series.frames(["host", "time_ms"]):  # the step series, a group of streams at a time
            ...
        yield Finding(Severity.WARNING, "title", "summary with numbers")   # no rule_id: Rule.run stamps it

- `needs` names tables; `"a|b"` means either. A rule whose needs are not met does not run,
  and the report and JSON say which input would let it run (tracelens.tables.INPUTS).
- `kind` is "symptom" (how much time went where), "cause" or "root cause" (joins sources).
- Settings are the function's keyword-only parameters: the default lives in the signature,
  the unit and one sentence in the decorator. A config file (`[rules.TL401] critical_share
  = 0.3`) overrides them; `tracelens rules TL401` lists them.
- `shared` names the groups of shared settings (Shared below: [steps], [baseline], [packets])
  the rule's derived results depend on beyond those its needs imply, so that `tracelens rules ID`
  lists them too. (`needs` names tables of the run; a group of settings is never called a table.)

Settings that shape a result several rules share are not one rule's: they are the RunContext's
`shared` (a config file's [steps], [baseline] and [packets] groups), each a frozen dataclass of
the module that computes the result, so every rule and report section sees the same result.

A report section (tracelens.report.sections) is a module with `context(ctx, analysis)`:
it reads derived results from `ctx` and the findings from `analysis`.

A new shared result is a `cached_property` here, computed by a function in a module of this
package from the tables and other properties (never a module-level cache). A table that may
outgrow memory (nccl_events, the NCCL communicator, channel, network and setting tables, steps,
packets) is read through `ctx.scan` for the rows and columns used, never held whole; a result
as big is written to `workdir` (the step series: derived.stream_groups).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from functools import cached_property
from pathlib import Path

import polars as pl

from tracelens.derived import (
    counters,
    events,
    flows,
    hangs,
    hosts,
    imbalance,
    nccl,
    ports,
    step_times,
    traces,
    window_signals,
)
from tracelens.derived.baseline import Baseline
from tracelens.derived.flows import PacketWindows
from tracelens.derived.step_times import SlowSteps
from tracelens.derived.stream_groups import StreamGroups
from tracelens.tables import RunTables


@dataclass(frozen=True)
class Shared:
    """The settings of results several rules share, in groups: the field's name is the group's ([steps] ...)."""

    steps: SlowSteps = SlowSteps()  # what makes a step slow
    baseline: Baseline = Baseline()  # when a window's signal rose above the run's own level
    packets: PacketWindows = PacketWindows()  # the capture analysis's time windows


SHARED = tuple(f.name for f in fields(Shared))


class RunContext:
    """The aligned tables of one run and the results derived from them, each computed once."""

    def __init__(self, tables: RunTables, shared: Shared | None = None, workdir: Path | None = None) -> None:
        self.tables = tables
        self.shared = shared or Shared()
        # where results too big for memory are written (a big run's step series): the run's working folder
        self.workdir = workdir
        self.slow_steps = self.shared.steps  # what makes a step slow (a config's [steps])
        self.baseline = self.shared.baseline  # when a window's signal rose (a config's [baseline])
        self._window_steps: dict[tuple[datetime, datetime], tuple[window_signals.Signal, ...]] = {}

    def __getitem__(self, name: str) -> pl.DataFrame:
        """Table `name`, aligned (a shortcut for `ctx.tables[name]`)."""
        return self.tables[name]

    def scan(self, name: str) -> pl.LazyFrame:
        """Table `name`, aligned, as a lazy frame (a shortcut for `ctx.tables.scan(name)`): for a table
        that may outgrow memory (`nccl_events`), collect only the columns, rows or aggregates shown."""
        return self.tables.scan(name)

    # -- steps -----------------------------------------------------------------------------------

    @cached_property
    def _step_groups(self) -> list[StreamGroups]:
        return step_times.step_groups(self.tables.frame("steps"), self.slow_steps, self.workdir)

    @property
    def step_series(self) -> StreamGroups:
        """Per stream and step: time, basis, comm/compute split, rolling baseline, slow flag; a group of
        whole streams at a time (`frames()`), or the few columns a query across streams needs (`scan()`)."""
        return self._step_groups[0]

    @property
    def wall_series(self) -> StreamGroups:
        """The step series timed by the step lines' timestamps, whatever timers the log has."""
        return self._step_groups[1]

    @cached_property
    def _timed(self) -> list[step_times.Timed]:
        return [step_times.timed(series, self.slow_steps) for series in self._step_groups]

    @property
    def slow_windows(self) -> list[step_times.Window]:
        """Slow windows of every stream against its rolling baseline, costliest first."""
        return self._timed[0].windows

    @property
    def sustained_windows(self) -> list[step_times.Window]:
        """Long slow stretches the rolling baseline absorbs."""
        return self._timed[0].sustained

    @cached_property
    def slow_episodes(self) -> list[step_times.Episode]:
        """The job's slow stretches, one per stretch whatever the number of logs that saw it, costliest first."""
        timers, wall = self._timed
        imbalanced = imbalance.imbalance_windows(self.step_series, self.peers_pace)
        return step_times.slow_episodes(timers, wall, self.slow_steps, imbalanced)

    @cached_property
    def peers_pace(self) -> pl.DataFrame:
        """Per engine and step, the ranks' usual forward and the job's pace (imbalance.peers_pace)."""
        return imbalance.peers_pace(self.step_series)

    @property
    def run_time_s(self) -> float:
        """Total step time of the longest stream."""
        return self._timed[0].run_time_s

    @cached_property
    def forward_waits(self) -> bool:
        """Whether forward holds collectives (ZeRO-3): then it is not a rank's own work."""
        return window_signals.forward_waits(self.tables)

    @cached_property
    def world_size(self) -> int:
        """How many ranks the job had, as far as its inputs tell (0: none say)."""
        return window_signals.world_size(self.tables)

    @cached_property
    def collective_times(self) -> pl.DataFrame:
        """Per file, rank and step, the time inside collectives by the comms logger (coll_ms)."""
        return window_signals.collective_times(self.tables)

    def step_signals(self, begin: datetime, end: datetime) -> tuple[window_signals.Signal, ...]:
        """Per rank, its compute, communication, between-steps and step time inside [begin, end]
        against outside it (window_signals.step_signals), once per window: TL402 and TL410 both judge
        each slow stretch's own window."""
        if (begin, end) not in self._window_steps:
            signals = window_signals.step_signals(
                self.step_series,
                begin,
                end,
                self.baseline,
                self.forward_waits,
                self.collective_times,
                self.peers_pace,
            )
            self._window_steps[begin, end] = tuple(signals)
        return self._window_steps[begin, end]

    # -- NCCL set-up -----------------------------------------------------------------------------

    @cached_property
    def nccl_versions(self) -> pl.DataFrame:
        """One row per `NCCL version` line, with its version (2.21.5) and build (+cuda12.4) apart."""
        return nccl.versions(self.tables)

    @cached_property
    def nccl_plugin_versions(self) -> pl.DataFrame:
        """One row per line naming a network plugin with its version (aws-ofi-nccl 1.13.2-aws, v6 ...)."""
        return nccl.plugin_versions(self.tables)

    @property
    def nccl_settings(self) -> pl.LazyFrame:
        """The echoed NCCL_* settings, values as set (without the period of NCCL's sentence)."""
        return nccl.settings(self.tables)

    @property
    def launcher_nccl_settings(self) -> pl.LazyFrame:
        """The NCCL_* settings a launcher printed as it exported them, as nccl_settings gives NCCL's echo."""
        return nccl.launcher_settings(self.tables)

    @cached_property
    def nccl_hosts(self) -> list[nccl.NcclHost]:
        """Per host, what NCCL said about its set-up: versions, networks, HCAs, transports, settings."""
        return nccl.hosts(self.tables, self.nccl_versions)

    # -- fabric ----------------------------------------------------------------------------------

    @cached_property
    def counter_deltas(self) -> pl.DataFrame:
        """What every counter did between successive dumps of its port."""
        return counters.counter_deltas(self.tables)

    @cached_property
    def latest_ports(self) -> pl.DataFrame:
        """Each HCA port as the last dump saw it."""
        return ports.latest_ports(self.tables)

    @cached_property
    def port_ranks(self) -> pl.DataFrame:
        """(host, ca, port, rank) for every rank whose NCCL process uses that port."""
        return ports.port_ranks(self.tables)

    # -- packets and events ----------------------------------------------------------------------

    @cached_property
    def packets(self) -> flows.PacketAnalysis | None:
        """Per-QP, per-flow and per-event analysis of the captures; None without packets."""
        return (
            flows.analyze(self.tables.frame("packets"), windows=self.shared.packets)
            if self.tables.height("packets")
            else None
        )

    @cached_property
    def captures(self) -> pl.DataFrame:
        """Per capture file: its frames and the time of its first and last (the packets table is
        read for these two columns only: in a run it is a lazy scan)."""
        return flows.capture_spans(self.tables.frame("packets"))

    @cached_property
    def throughput_bins(self) -> pl.DataFrame:
        """Bytes per 10 ms between each pair of captured addresses (the peak-rate signal's input)."""
        return window_signals.throughput_bins(self.tables)

    @cached_property
    def host_names(self) -> dict[str, str]:
        """IP address -> host name, from the interfaces NCCL said it uses, the hosts' listings and the
        rendezvous (hosts.host_names)."""
        return hosts.host_names(self.tables)

    # -- hangs (Flight Recorder dumps and stack dumps) -----------------------------------------

    @cached_property
    def fr_entries(self) -> pl.DataFrame:
        """Flight Recorder entries, one row per rank, group and record (the best encoding of each)."""
        return hangs.entries(self.tables)

    @cached_property
    def stuck_collectives(self) -> list[hangs.Stuck]:
        """The collectives the job hung in, per process group, worst first."""
        return hangs.stuck(self.tables)

    @cached_property
    def desyncs(self) -> list[hangs.Desync]:
        """Ranks that issued different collectives at one sequence id."""
        return hangs.desyncs(self.tables)

    @cached_property
    def first_stopped(self) -> hangs.Stop | None:
        """The rank that stopped first and where it was; None without Flight Recorder entries."""
        return hangs.first_stopped(self.tables)

    @cached_property
    def stack_hang(self) -> hangs.StackHang | None:
        """Where the ranks' stack dumps show them waiting; None unless they show a hang."""
        return hangs.stack_hang(self.tables)

    @cached_property
    def last_steps(self) -> pl.DataFrame:
        """Per rank that logged steps, its last step and when it ended (hangs.last_steps): one pass over
        the step series for every hang rule."""
        return hangs.last_steps(self.step_series)

    @cached_property
    def network_events(self) -> pl.DataFrame:
        """NCCL errors, counter rises and packet events on one UTC axis (tracelens.derived.events)."""
        return events.network_events(self.tables, self.counter_deltas, self.packets, self.host_names)

    # -- profiler traces (tracelens.derived.traces) ---------------------------------------------

    @cached_property
    def trace_breakdown(self) -> pl.DataFrame:
        """Per rank and ProfilerStep (and per rank over the whole trace, `step` null): the window and
        its computation, communication (overlapped and exposed), memory and idle time, in us."""
        return traces.breakdown(self.scan("trace_spans"))

    @cached_property
    def collective_arrivals(self) -> pl.DataFrame:
        """Per collective matched across the ranks' traces, each rank's arrival, its wait for the last
        rank (clock and duration based) and whether it came last."""
        return traces.arrivals(self.scan("trace_spans"), self.scan("trace_ranks"))

    @cached_property
    def trace_host_waits(self) -> pl.DataFrame:
        """Per rank and step, the GPU's idle time waiting for the host to launch work (traces.host_waits)."""
        return traces.host_waits(self.scan("trace_spans"))

    @cached_property
    def trace_levels(self) -> pl.DataFrame:
        """Per rank and step, the timing model's parts the traces measure (traces.step_levels)."""
        return traces.step_levels(self.trace_breakdown, self.collective_arrivals)

    def trace_signals(self, begin: datetime, end: datetime) -> list[window_signals.Signal]:
        """Per rank, its traced own work, time in collectives and wait for the last rank inside
        [begin, end] against outside it, each rank named as its step signals name it (else by its trace's host)."""
        if self.tables.height("trace_spans") == 0:
            return []
        traced = self["trace_ranks"].filter(pl.col("rank").is_not_null()).unique("rank").iter_rows(named=True)
        names = {r["rank"]: (f"rank {r['rank']}" + (f" ({r['host']})" if r["host"] else ""), r["host"]) for r in traced}
        names |= {
            s.rank: (s.where, s.hosts[0] if s.hosts else None)
            for s in self.step_signals(begin, end)
            if s.rank is not None
        }
        return traces.window_signals(self.trace_levels, begin, end, names, self.baseline)

    @cached_property
    def trace_waits(self) -> pl.DataFrame:
        """Per rank and step: its collectives, the time it waited for later ranks and how often it came last."""
        return traces.rank_waits(self.collective_arrivals)
