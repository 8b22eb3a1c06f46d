"""perftest results (ib_write_bw, ib_read_bw, ib_send_bw and the *_lat tests) into `perftest`.

grammars/perftest.lark is the spec of the line kinds; each distinct line shape is parsed
once. A run's header (`Device`, `Link type`, `Mtu`, `GID index`) applies to the result rows
under it; a bandwidth row is `#bytes #iterations BW-peak BW-average MsgRate` in the unit the
column header names (MB/sec, or Gb/sec with --report_gbits), a latency row the t_min ...
99.9% percentile columns in microseconds. Server and client output interleaved in one file
(both sides of a loopback test) still give each row once per side. Test-runner wrappers
(avocado's `... DEBUG| [stdout] `) are removed first and give the line its time.
"""

from __future__ import annotations

import re

import polars as pl

from tracelens.ingest import IngestResult, InputFile, input_format
from tracelens.ingest.host.hostlines import (
    IGNORED,
    PARSED,
    ShapeGrammar,
    account,
    local_time,
    provenance,
)
from tracelens.ingest.text.lines import number, read_lines
from tracelens.ingest.text.shell_context import context
from tracelens.tables import PROVENANCE_COLUMNS

GRAMMAR = ShapeGrammar("perftest")
_SNIFF = re.compile(
    rb"(?:RDMA_Write|RDMA_Read|Send|Atomic\w*|Write|Read) (?:BW|Latency|Lat) Test"
    rb"|#bytes\s+#iterations\s+(?:BW peak|t_min)"
)
_WRAPPER = r"^(?P<wts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+\s+L\d+\s+\w+\| ?(?P<stdout>\[std(?:out|err)\] ?)?"
_ATTRS = {"Device": "device", "Link type": "link_type", "Mtu": "mtu", "GID index": "gid_index"}
BW_COLUMNS = ["bytes", "iterations", "bw_peak", "bw_avg", "msg_rate_mpps"]
LAT_NAMES = {
    "t_min": "lat_min_us",
    "t_max": "lat_max_us",
    "t_typical": "lat_typical_us",
    "t_avg": "lat_avg_us",
    "t_stdev": "lat_stdev_us",
    "99%": "lat_p99_us",
    "99.9%": "lat_p999_us",
}
LAT_COLUMNS = list(LAT_NAMES.values())


def sniff(head: bytes) -> bool:
    return (b" Test" in head or b"#bytes" in head) and _SNIFF.search(head) is not None


def _attribute(text: pl.Expr, key: str) -> pl.Expr:
    return (
        text.str.strip_chars()
        .str.extract(rf"(?:^|\t|\s{{2,}}){re.escape(key)}\s*:\s*([^\t]+?)(?:\t|\s{{3,}}|$)", 1)
        .str.strip_chars()
    )


def _columns(header: str) -> list[str]:
    """The table columns a header names: the bandwidth layout, or the latency columns this
    perftest version prints (t_min ... 99.9% percentile; older versions stop at t_typical)."""
    if "BW" in header:
        return BW_COLUMNS
    return [
        "bytes",
        "iterations",
        *(LAT_NAMES[m] for m in re.findall(r"(t_\w+?)\[usec\]|(\d+(?:\.\d+)?%) percentile", header) for m in m if m),
    ]


@input_format("perftest", priority=93, sniff=sniff)
def ingest(source: InputFile) -> IngestResult:
    raw = read_lines(source)
    wrapped = raw.with_columns(w=pl.col("text").str.extract_groups(_WRAPPER)).unnest("w")
    runner_only = pl.col("wts").is_not_null() & pl.col("stdout").is_null()
    lines = wrapped.with_columns(text=pl.col("text").str.replace(_WRAPPER, "")).select("line", "text", "wts", "stdout")
    lines = GRAMMAR.kinds(
        context(lines).with_columns(ctx=pl.when(runner_only).then(pl.lit(IGNORED, pl.UInt8)).otherwise("ctx"))
    )
    text, kind = pl.col("text"), pl.col("kind")
    header_kinds = ["title", "bw_header", "lat_header"]
    lines = lines.with_columns(
        run=(kind == "title").fill_null(False).cum_sum(),
        test=pl.when(kind == "title").then(text.str.strip_chars()),
        table=pl.when(kind.is_in(header_kinds[1:])).then(text),  # the column header names the row's columns
        bw_unit=pl.when(kind == "bw_header").then(text.str.extract(r"BW average\[([^\]]+)\]", 1)),
        **{col: pl.when(kind == "attributes").then(_attribute(text, key)) for key, col in _ATTRS.items()},
    ).with_columns(
        pl.col("test", "device", "link_type", "mtu", "gid_index").forward_fill().over("run"),
        pl.col("table", "bw_unit").forward_fill(),
    )
    cells = text.str.extract_all(r"\S+")
    frames = []
    for table in lines["table"].drop_nulls().unique(maintain_order=True).to_list():
        names = _columns(table)
        rows = lines.filter(kind == "row", pl.col("table") == table, cells.list.len() == len(names))
        if rows.height:
            frames.append(
                rows.with_columns(
                    [
                        (
                            cells.list.get(i).cast(pl.Int64, strict=False)
                            if n in ("bytes", "iterations")
                            else number(cells.list.get(i))
                        ).alias(n)
                        for i, n in enumerate(names)
                    ]
                )
            )
    rows = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    fitted = rows["line"] if rows.height else pl.Series([], dtype=pl.Int64)
    status = lines.select(
        pl.when(pl.col("ctx").is_not_null())
        .then(pl.col("ctx"))
        .when(kind == "row")
        .then(pl.when(pl.col("line").is_in(fitted.implode())).then(pl.lit(PARSED, pl.UInt8)))
        .when(kind == "rule")
        .then(pl.lit(IGNORED, pl.UInt8))
        .when(kind.is_not_null())
        .then(pl.lit(PARSED, pl.UInt8))
    ).to_series()
    result = IngestResult(account=account(lines, status))
    if rows.height:
        frame = provenance(source, rows, local_time(pl.col("wts"), "%Y-%m-%d %H:%M:%S,%3f")).with_columns(
            mtu=pl.col("mtu").str.extract(r"(\d+)", 1).cast(pl.Int32, strict=False),
            gid_index=pl.col("gid_index").cast(pl.Int32, strict=False),
            ts_text=pl.col("wts").str.strip_chars(),  # the runner's stamp as printed (null: the `date` line's)
        )
        keep = [
            *PROVENANCE_COLUMNS,
            "test",
            "device",
            "link_type",
            "mtu",
            "gid_index",
            "bw_unit",
            "run",
            *[c for c in BW_COLUMNS + LAT_COLUMNS if c in frame.columns],
        ]
        result.add("perftest", frame.select(keep))
    return result
