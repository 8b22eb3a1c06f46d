"""A table too big for memory as groups of whole streams, so that a per-stream analysis holds one group.

A *stream* is the rows of one value of the key columns (the step analysis's: file, host, rank,
engine). The streams are taken in the order of their keys (nulls last, as `sort` puts them) and cut
into runs of about GROUP_ROWS rows, each run a *group*: one group after the other, each sorted by the
keys, is the whole table sorted by the keys, so a computation that works stream by stream (window
functions `over` the keys, a loop over `group_by(keys, maintain_order=True)`) gives, group by group,
exactly what one pass over the whole table gives, in the same order.

A table in memory, or small enough, is one group held as it is. A big one (a lazy scan of the run's
spilled Parquet) is split in one pass, a slice of rows at a time, into a Parquet part per group and
slice in a folder of the run's working folder; what is computed from the groups (`map`) is written there
too, a file per group, and read back one group at a time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import polars as pl

GROUP_ROWS = 1 << 18  # rows of whole streams per group
SLICE_ROWS = 1 << 18  # rows of the table read at a time while it is split


class StreamGroups:
    """The rows of a table as groups of whole streams (the module doc), in memory or as Parquet files."""

    def __init__(
        self, keys: Sequence[str], parts: Sequence[pl.DataFrame | list[Path]], streams: pl.DataFrame | None = None
    ):
        self.keys = list(keys)
        self.parts = list(parts)  # one per group: its rows, or the Parquet files that hold them in order
        # per stream (in key order): its keys, rows and group; None when the table is one group in memory
        self.streams = streams

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pl.DataFrame]:
        """Each group's rows (`columns` of them, or all), one group at a time."""
        for part in self.parts:
            if isinstance(part, pl.DataFrame):
                yield part if columns is None else part.select(columns)
            else:
                yield pl.read_parquet(part, columns=None if columns is None else list(columns))

    def _lazy(self, part: pl.DataFrame | list[Path]) -> pl.LazyFrame:
        return part.lazy() if isinstance(part, pl.DataFrame) else pl.scan_parquet(part)

    def scan(self) -> pl.LazyFrame:
        """Every group's rows as one lazy frame, in group order: for the few columns or rows a query
        across streams needs (collect what it shows, not the rows)."""
        return pl.concat([self._lazy(part) for part in self.parts])

    def stream(self, values: Sequence) -> pl.DataFrame:
        """The rows of the stream whose keys are `values` (read from its group alone)."""
        match = pl.all_horizontal(pl.col(k).eq_missing(v) for k, v in zip(self.keys, values))
        if self.streams is None:
            return pl.concat([frame.filter(match) for frame in self.frames()])
        found = self.streams.filter(match)["group"]
        if found.len() == 0:
            return self.scan().filter(match).collect()  # no such stream: no rows, with the columns
        return self._lazy(self.parts[int(found[0])]).filter(match).collect()

    def by(self, keys: Sequence[str], columns: Sequence[str] | None = None) -> Iterator[pl.DataFrame]:
        """Frames (of `columns`, or all) in which every value of `keys` (some of the stream keys) has all
        its rows, in the table's order: each group's rows but those of the values that several groups
        share (a host whose streams a group boundary cuts, a rank logged in several files), then the
        rows of those values, a group's worth at a time, read from every group by filter. For a
        computation per value of `keys` across streams."""
        keys = list(keys)
        if self.streams is None:
            yield from self.frames(columns)
            return
        shared = (
            self.streams.group_by(keys)
            .agg(pl.col("group").n_unique().alias("groups"), pl.col("rows").sum())
            .filter(pl.col("groups") > 1)
            .sort(keys, nulls_last=True)
            .with_columns(batch=(pl.col("rows").cum_sum() - pl.col("rows")) // GROUP_ROWS)
        )
        for frame in self.frames(columns):
            yield frame.join(shared.select(keys), on=keys, how="anti", nulls_equal=True, maintain_order="left")
        rows = self.scan() if columns is None else self.scan().select(columns)
        for _, values in shared.group_by("batch", maintain_order=True):
            mine = values.select(keys).lazy()
            yield rows.join(mine, on=keys, how="semi", nulls_equal=True, maintain_order="left").collect(
                engine="streaming"
            )

    def map(
        self, funcs: Sequence[Callable[[pl.DataFrame], pl.DataFrame]], columns: Sequence[str] | None = None
    ) -> list[StreamGroups]:
        """Each of `funcs` applied to every group (`columns` of it, or all; a function that works stream by
        stream and keeps the streams' rows), in one pass over the groups: spilled groups give spilled
        results, a file per group beside theirs."""
        results: list[list[pl.DataFrame | list[Path]]] = [[] for _ in funcs]
        homes: list[Path] = []
        for part, frame in zip(self.parts, self.frames(columns)):
            for j, func in enumerate(funcs):
                done = func(frame)
                if isinstance(part, pl.DataFrame):
                    results[j].append(done)
                    continue
                if len(homes) <= j:
                    homes.append(Path(tempfile.mkdtemp(dir=part[0].parent)))
                path = homes[j] / f"{len(results[j]):06d}.parquet"
                done.write_parquet(path, compression="lz4")
                results[j].append([path])
        return [StreamGroups(self.keys, parts, self.streams) for parts in results]


def split(
    rows: pl.LazyFrame | pl.DataFrame,
    keys: Sequence[str],
    folder: Path | None,
    prepare: Callable[[pl.LazyFrame], pl.LazyFrame] = lambda rows: rows,
) -> StreamGroups:
    """`rows` (each slice of them passed through `prepare`, which works row by row: a fill, a filter)
    as groups of whole streams of `keys`. Rows in memory, or a scan of no more than a group's rows, or
    no `folder` to write to, are one group in memory (no rows: one empty group, with the columns);
    else each group is written under `folder`."""
    if isinstance(rows, pl.DataFrame) or folder is None:
        return StreamGroups(keys, [prepare(rows.lazy()).collect()])
    streams = (
        prepare(rows).group_by(keys).agg(pl.len().alias("rows")).sort(keys, nulls_last=True).collect(engine="streaming")
    )
    if streams["rows"].sum() <= GROUP_ROWS:
        return StreamGroups(keys, [prepare(rows).collect(engine="streaming")])
    streams = streams.with_columns(group=((pl.col("rows").cum_sum() - pl.col("rows")) // GROUP_ROWS).rank("dense") - 1)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(dir=folder))
    height = rows.select(pl.len()).collect().item()
    parts: dict[int, list[Path]] = {}
    groups = streams.lazy().select(*keys, "group")
    for offset in range(0, height, SLICE_ROWS):
        chunk = prepare(rows.slice(offset, SLICE_ROWS)).join(groups, on=keys, nulls_equal=True, maintain_order="left")
        for (group,), piece in chunk.collect().partition_by("group", as_dict=True, maintain_order=True).items():
            path = home / f"{group:06d}-{offset:012d}.parquet"
            piece.drop("group").write_parquet(path, compression="lz4", statistics=False)
            parts.setdefault(int(group), []).append(path)  # type: ignore[call-overload]
    return StreamGroups(keys, [parts[g] for g in sorted(parts)], streams.with_columns(pl.col("group").cast(pl.Int64)))
