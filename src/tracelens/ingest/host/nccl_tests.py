"""nccl-tests output (`all_reduce_perf` and the other `*_perf`) into nccl_tests, as a line
parser of the shared text-log pass: the results come interleaved with NCCL INFO lines and
behind launcher prefixes (`[1,0]<stdout>:` of Open MPI, `host: ` of pdsh, a runner's
`host [stderr] `, a shipper's time: ingest/text/prefixes.py).

grammars/nccl_tests.lark is the spec. Result rows are many and all distinct, so they are
read with the equivalent vectorized split (tests prove it agrees with the grammar):
- 2.x: `size count type redop root | time algbw busbw #wrong` out-of-place, then in-place;
- before 2.x: `size count type redop | time algbw busbw error` twice (a float error or N/A);
- old all-to-all: no redop column.
`# Avg bus bandwidth : 66.48` becomes a row of kind `average`. A `# nThread ...` line starts
a run; the `#  Rank N ... on HOST device ...` lines under it say how many ranks and hosts.
"""

from __future__ import annotations

import polars as pl

from tracelens.ingest import IngestResult, InputFile, line_format
from tracelens.ingest.text.lines import NOT_MINE, PARSED, UNRECOGNIZED, file_of, number
from tracelens.ingest.text.prefixes import LAUNCHER_PREFIX
from tracelens.tables import PROVENANCE_COLUMNS

PREFIX = rf"^(?P<prefix>{LAUNCHER_PREFIX})"
_ROW = PREFIX + r"\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<dtype>[a-z][a-z0-9_]*)\s+(?P<rest>(?:\S+\s+){7,9}\S+)\s*$"
_HEADER = PREFIX + (
    r"#(?:\s*$| nThread | Using devices| +Rank +\d+ | +(?:(?:size|out-of-place)\b|\(B\))| Out of bounds values"
    r"| Avg bus bandwidth"
    r"| nccl-tests version| Collective test (?:starting|concluded)| Rank lists? (?:trimmed|shortened)|\s+\.\.\.)"
)
_RANK = PREFIX + (
    r"#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+"
    r"(?P<host>\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(?P<gpu>.*?)\s*$"
)
_AVG = PREFIX + r"# Avg bus bandwidth\s*:\s*(?P<avg>[\d.]+)"
_TEST = r"\b(?P<test>[a-z_]+_perf)\b"
_ROWLIKE = PREFIX + r"\s*\d+\s+\d+\s+(?:float|half|double|bfloat16|bf16|fp8\w*|f8\w*|u?int(?:8|32|64)?)\s"
_COLUMN_HEADER = PREFIX + r"#\s+size\s+count\s+type\b"
_CANDIDATE = PREFIX + r"\s*[#\d]"
# Every line the parser may claim matches one of these: a file without one is none of its business.
CANDIDATES = (_HEADER, _ROW)

COLUMNS_NEW = [
    "redop",
    "root",
    "time_out",
    "algbw_out",
    "busbw_out",
    "wrong_out",
    "time_in",
    "algbw_in",
    "busbw_in",
    "wrong_in",
]
# The table's columns after the provenance's.
COLUMNS = [
    "test", "kind", "size_bytes", "count", "dtype", "redop", "root", "placement", "time_us", "algbw_gbs",
    "busbw_gbs", "wrong", "error", "nranks", "rank_hosts", "ranks_per_host", "gpu_name", "run", "prefix",
]  # fmt: skip
COLUMNS_OLD = [c for c in COLUMNS_NEW if c != "root"]  # before the root column was printed
COLUMNS_NO_REDOP = COLUMNS_OLD[1:]


@line_format("nccl_tests", candidates=CANDIDATES)
class NcclTestsParser:
    """Claims nccl-tests header and result lines of a text log, or of a batch of small files (their
    lines keyed by file, lines.FILE_SHIFT: runs are numbered, and tests and column layouts carried,
    within each file); rows are built in `finish`."""

    def __init__(self, source: InputFile) -> None:
        self.source = source
        self.parts: list[pl.DataFrame] = []
        self.file, self.run = 0, 0  # the last file fed, and its last run

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        # Every line this parser reads starts (after a launcher tag) with `#` or a digit, or names a
        # `*_perf` test: the eight regexes below run on those lines only, not on every
        # line of an NCCL log.
        candidate = chunk["text"].str.contains(_CANDIDATE) | chunk["text"].str.contains("_perf", literal=True)
        status = pl.repeat(NOT_MINE, chunk.height, dtype=pl.UInt8, eager=True)
        if not candidate.any():
            return status
        rows = candidate.arg_true()
        return status.scatter(rows, self._feed(chunk.filter(candidate)))

    def _feed(self, chunk: pl.DataFrame) -> pl.Series:
        text = pl.col("text")
        found = chunk.with_columns(
            header=text.str.contains(_HEADER),
            pfx=text.str.extract(PREFIX, 1),
            row=text.str.extract_groups(_ROW),
            starts=text.str.contains(PREFIX + r"# nThread "),
            old=pl.when(text.str.contains(_COLUMN_HEADER)).then(text.str.contains(r"busbw\s+error")),
            test=text.str.extract(_TEST, 1),
            rank=text.str.extract_groups(_RANK),
            avg=number(text.str.extract(_AVG, 2)),
        ).unnest("row")
        claimed = found["header"] | found["size"].is_not_null()
        if not claimed.any() and not self.parts:
            return pl.Series(chunk.height * [NOT_MINE], dtype=pl.UInt8)
        file = file_of(pl.col("line"))
        found = found.with_columns(_file=file).with_columns(
            run=pl.col("starts").cum_sum().over("_file")
            + pl.when(pl.col("_file") == self.file).then(self.run).otherwise(0)
        )
        self.file, self.run = found["_file"][-1], found["run"][-1]
        rows = found.filter(
            pl.col("size").is_not_null()
            | pl.col("avg").is_not_null()
            | pl.col("rank").struct.field("rank").is_not_null()
            | pl.col("test").is_not_null()
            | pl.col("old").is_not_null()
        )
        self.parts.append(rows)
        bad = chunk["text"].str.contains(_ROWLIKE) & found["size"].is_null()
        return pl.select(
            pl.when(pl.lit(bad))
            .then(pl.lit(UNRECOGNIZED, pl.UInt8))
            .when(pl.lit(claimed))
            .then(pl.lit(PARSED, pl.UInt8))
            .otherwise(pl.lit(NOT_MINE, pl.UInt8))
        ).to_series()

    def finish(self, result: IngestResult) -> None:
        if not self.parts:
            return
        lines = pl.concat(self.parts).with_columns(
            test=pl.col("test").forward_fill().backward_fill().over("_file"),
            old=pl.col("old").forward_fill().fill_null(False).over("_file"),
        )
        ranks = (
            lines.filter(pl.col("rank").struct.field("rank").is_not_null())
            .group_by("_file", "run")
            .agg(
                nranks=pl.col("rank").struct.field("rank").n_unique(),
                rank_hosts=pl.col("rank").struct.field("host").unique(maintain_order=True).str.join(","),
                ranks_per_host=pl.col("rank").struct.field("host").value_counts().struct.field("count").max(),
                gpu_name=pl.col("rank").struct.field("gpu").first(),
            )
        )
        frames = [
            _rows(lines.filter(pl.col("size").is_not_null())),
            _averages(lines.filter(pl.col("avg").is_not_null())),
        ]
        table = (
            pl.concat([f for f in frames if f.height], how="diagonal_relaxed")
            if any(f.height for f in frames)
            else None
        )
        if table is None:
            return
        table = table.with_columns(_file=file_of(pl.col("line"))).join(ranks, on=["_file", "run"], how="left")
        table = table.with_columns(
            file=pl.lit(self.source.name),
            host=pl.lit(None, pl.String),
            ts=pl.lit(None, pl.Datetime("ns", "UTC")),
            ts_quality=pl.lit("none"),
            ts_text=pl.lit(None, pl.String),  # nccl-tests prints no time
        )
        result.add(
            "nccl_tests",
            # the columns the rows have (an output cut after its results has only its average's):
            # tables.conform makes the others null
            table.select(*PROVENANCE_COLUMNS, *(c for c in COLUMNS if c in table.columns)),
        )


def _rows(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per result line and placement, whatever the column layout of its version."""
    if rows.height == 0:
        return pl.DataFrame()
    tokens = rows.with_columns(cells=pl.col("rest").str.extract_all(r"\S+"))
    frames = []
    for width, names in ((10, COLUMNS_NEW), (9, COLUMNS_OLD), (8, COLUMNS_NO_REDOP)):
        mine = tokens.filter(pl.col("cells").list.len() == width)
        if mine.height == 0:
            continue
        cells = mine.with_columns([pl.col("cells").list.get(i).alias(n) for i, n in enumerate(names)])
        for place in ("out", "in"):
            flag = pl.col(f"wrong_{place}")
            frames.append(
                cells.select(
                    "line",
                    "test",
                    "run",
                    pl.col("prefix").replace("", None),
                    pl.lit("row").alias("kind"),
                    pl.col("size").cast(pl.Int64).alias("size_bytes"),
                    pl.col("count").cast(pl.Int64),
                    "dtype",
                    (pl.col("redop") if "redop" in names else pl.lit(None, pl.String)).alias("redop"),
                    (pl.col("root").cast(pl.Int64, strict=False) if "root" in names else pl.lit(None, pl.Int64)).alias(
                        "root"
                    ),
                    pl.lit(place).alias("placement"),
                    number(pl.col(f"time_{place}")).alias("time_us"),
                    number(pl.col(f"algbw_{place}")).alias("algbw_gbs"),
                    number(pl.col(f"busbw_{place}")).alias("busbw_gbs"),
                    pl.when(~pl.col("old")).then(flag.cast(pl.Int64, strict=False)).alias("wrong"),
                    pl.when(pl.col("old")).then(number(flag)).alias("error"),
                )
            )
    return pl.concat(frames) if frames else pl.DataFrame()


def _averages(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.select(
        "line",
        "test",
        "run",
        pl.col("pfx").replace("", None).alias("prefix"),
        pl.lit("average").alias("kind"),
        pl.col("avg").alias("busbw_gbs"),
    )
