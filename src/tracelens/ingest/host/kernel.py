"""Kernel logs into kernel_events: dmesg (raw, -T, --time-format iso, -H deltas), /dev/kmsg
records, journalctl -k and syslog lines.

grammars/kernel.lark is the spec of the record prefixes and of the message kinds that
matter for a training job (link down/up, NIC transmit timeouts, PCIe AER, NVIDIA Xid, OOM
kills, soft lockups, hung tasks, NIC firmware errors); every other record is kind `other`.
Kernel logs run to millions of lines with all-distinct bodies, so records are split and
classified with the equivalent vectorized regular expressions (tests prove they agree
with the grammar on the corpus and the fixtures).

Times: -T and syslog times are local wall time (syslog without a year: the file's year);
`--time-format iso` carries its zone (`zoned`); raw dmesg and kmsg carry only seconds since
boot (`uptime_s`, no `ts`); -H deltas carry neither. Indented lines under a record are its
continuation (the NVRM crash-dump notice).
"""

from __future__ import annotations

from datetime import datetime, timezone

import polars as pl

from tracelens.ingest import Account, Batch, InputFile, LineStart, input_format
from tracelens.ingest.host.hostlines import IGNORED, PARSED, accounts, merge, provenance
from tracelens.ingest.text.lines import LINE_MASK, number, read_chunks, read_files
from tracelens.ingest.text.shell_context import context

_PREFIX = (
    r"^(?:(?P<level>[a-z]+\s*:[a-z]+\s*): )?"  # dmesg -x: `kern  :err   : `
    r"(?:\[\s*(?P<up>\d+\.\d+)(?: <\s*[\d.]+>)?\](?:\s+(?P<monohost>\S+) kernel:)?"  # journalctl -o short-monotonic
    r"|\[\s*\+(?P<delta>\d+\.\d+)\]"
    r"|\[(?P<ctime>\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})\]"
    r"|(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)?)(?:\s+(?P<isohost>\S+) kernel:)?"
    # journalctl -k -o short-full, -o short-unix
    r"|\w{3} (?P<full>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (?P<fzone>\w+)\s+(?P<fullhost>\S+) kernel:"
    r"|(?P<unix>\d{9,10}\.\d+)\s+(?P<unixhost>\S+) kernel:"
    r"|(?P<kmsg>\d+,\d+,(?P<kus>\d+),[^;]*;)"
    r"|(?P<stime>\w{3} [ \d]\d \d\d:\d\d:\d\d)(?:\.(?P<sfrac>\d+))?\s+(?P<shost>\S+)\s+(?P<tag>[\w./-]+)(?:\[\d+\])?:"
    r"|(?P<bare>kernel:))"
    r"\s?(?P<body>.*)$"
)
_SNIFF = LineStart(
    rb"(?:[a-z]+\s*:[a-z]+\s*: )?(?:\[\s*\+?\d+\.\d{6}\] |\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] |"
    rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d{6}[+-]\d\d:\d\d |"
    # journalctl -k -o short-iso[-precise], short-full, short-unix (a monitoring agent's choice): the host
    # and `kernel:` after the time tell them from other logs that start with a time
    rb"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)"
    rb"|\w{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \w+|\d{9,10}\.\d+) \S+ kernel: |"
    rb"\d+,\d+,\d+,[^;\n]*;|\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ kernel: |kernel: "
    rb"|-- (?:Logs begin|Journal begins|Boot [0-9a-f]|No entries --)|No journal files were found\.)"
)
_JOURNAL_BANNER = (
    r"^-- (?:Logs begin at|Journal begins at|Boot [0-9a-f]+|No entries|Reboot) .*--?\s*$|^-- No entries --$"
    r"|^No journal files were found\.$"
)

_DEVICE_TAG = (
    r"^(?P<sub>[\w-]+)(?: (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]))?(?: (?P<nd>[\w.@-]+))?:"
)

# (kind, pattern on the message body); the first that matches wins, as in the grammar.
KINDS = [
    ("xid", r"^NVRM: Xid \("),
    ("tx_timeout", r"NETDEV WATCHDOG:|^[\w-]+(?: \S+)*: TX timeout"),
    (
        "link_down",
        r"(?i)(?:^|[: ])(?:NIC )?Link(?: is)? Down\b|\blost carrier\b|Port module event: module \d+, Cable unplugged",
    ),
    (
        "link_up",
        r"(?i)(?:^|[: ])(?:NIC )?Link(?: is)? Up\b|Port module event: module \d+, Cable plugged|link becomes ready",
    ),
    ("pcie_aer", r"AER: (?:Multiple )?(?:Corrected|Uncorrected(?: \((?:Non-)?Fatal\))?) error received:"),
    ("pcie_aer_detail", r"^[\w-]+ [0-9a-fA-F:.]+:\s+(?:PCIe Bus Error:|device \[|\[\s*\d+\]|AER:)"),
    ("oom_kill", r"Out of memory(?: \(oom_kill_allocating_task\))?: Kill(?:ed)? process"),
    ("oom_detail", r"^oom-kill:|^oom_reaper:|^\S+ invoked oom-killer:"),
    ("soft_lockup", r"^(?:watchdog: )?BUG: soft lockup"),
    ("hung_task", r"^INFO: task "),
    (
        "nic_error",
        (
            r"(?i)^[\w-]+ [0-9a-fA-F:.]+.*(?:health compromised|FW fatal|firmware fatal|fatal error|"
            r"PCI channel offline|command timeout)"
        ),
    ),
]

# Drivers whose other records stay in the table: they name the NIC or GPU at a PCI address.
NOTED = [
    "mlx5_core",
    "mlx4_core",
    "mlx4_en",
    "mlx5_ib",
    "bnxt_en",
    "ice",
    "i40e",
    "ixgbe",
    "igb",
    "NVRM",
    "nvidia",
    "pcieport",
]
COLUMNS = [
    "file",
    "line",
    "host",
    "ts",
    "ts_quality",
    "ts_text",
    "zoned",
    "uptime_s",
    "kind",
    "subsystem",
    "device",
    "netdev",
    "xid",
    "detail",
    "message",
]

# NVIDIA's Xid catalog: what each error means (docs.nvidia.com/deploy/xid-errors).
XID_MEANINGS = {
    8: "GPU stopped processing", 13: "Graphics Engine Exception (a kernel faulted: illegal address or instruction)",
    31: "GPU memory page fault (a kernel touched an illegal address)", 32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error", 43: "GPU stopped processing (the application faulted)",
    45: "Preemptive cleanup after earlier errors (the process was killed or a previous Xid)",
    48: "Double-bit ECC error (uncorrectable memory error)", 61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt", 63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed", 68: "Video processor exception",
    69: "Graphics Engine class error",
    74: "NVLink error", 79: "GPU has fallen off the bus (PCIe link lost)", 92: "High single-bit ECC error rate",
    94: "Contained ECC error", 95: "Uncontained ECC error", 109: "Context switch timeout", 119: "GSP RPC timeout",
    120: "GSP error", 121: "C2C link error", 123: "SPDM failure", 140: "Unrecovered ECC error",
    143: "GPU initialization failure", 144: "NVLink error (SAW)", 145: "NVLink error (RLW)", 146: "NVLink error (TLW)",
    147: "NVLink error (TREX)", 148: "NVLink error (NVLPW control)", 149: "NVLink error (NETIR)",
    150: "NVLink error (MSE)",
    154: "GPU recovery action changed (reset or reboot needed)",
}  # fmt: skip


def sniff(head: bytes) -> bool:
    found = _SNIFF.count(head[:16384])
    lines = [ln for ln in head[:16384].splitlines()[:40] if ln.strip()]
    return found >= max(1, min(3, len(lines) // 2))


def classify(body: pl.Expr) -> pl.Expr:
    """The kind of a record from its message body (the grammar's `message`)."""
    expr = pl.lit("other")
    for kind, pattern in reversed(KINDS):
        expr = pl.when(body.str.contains(pattern)).then(pl.lit(kind)).otherwise(expr)
    return expr


def _year(source: InputFile) -> int:
    return datetime.fromtimestamp(source.path.stat().st_mtime, timezone.utc).year


def records(lines: pl.DataFrame, year: int | pl.Expr) -> pl.DataFrame:
    """Every line with a record prefix: its time fields, body, kind and named device; `year`: the
    year of syslog times (which print none), for every line or each line's."""
    parts = lines.with_columns(p=pl.col("text").str.extract_groups(_PREFIX)).unnest("p")
    recs = parts.filter(pl.col("body").is_not_null())
    spaced = lambda c: pl.col(c).str.replace_all(r"\s+", " ")  # noqa: E731
    iso = pl.col("iso").str.replace(",", ".").str.replace(r"([+-]\d\d)(\d\d)$", "$1:$2")
    iso_zoned = iso.str.contains(r"(?:[+-]\d\d:\d\d|Z)$")
    iso_ts = (
        pl.when(iso_zoned)
        .then(iso.str.to_datetime(time_zone="UTC", strict=False, time_unit="ns"))
        .otherwise(iso.str.to_datetime(strict=False, time_unit="ns").dt.replace_time_zone("UTC"))
    )
    ctime = (
        spaced("ctime")
        .str.to_datetime("%a %b %d %H:%M:%S %Y", strict=False, time_unit="ns")
        .dt.replace_time_zone("UTC")
    )
    stime = (
        ((year if isinstance(year, pl.Expr) else pl.lit(year)).cast(pl.String) + " " + spaced("stime"))
        .str.to_datetime("%Y %b %d %H:%M:%S", strict=False, time_unit="ns")
        .dt.replace_time_zone("UTC")
    )
    stime = stime + pl.duration(
        microseconds=pl.col("sfrac").str.pad_end(6, "0").str.slice(0, 6).cast(pl.Int64, strict=False).fill_null(0)
    )
    tag = pl.col("body").str.extract_groups(_DEVICE_TAG)
    xid = pl.col("body").str.extract(r"^NVRM: Xid \((?:PCI:)?([^)]*)\): (\d+)", 2).cast(pl.Int64, strict=False)
    # short-full prints the zone's abbreviation: only UTC/GMT say which; others are local wall time
    full = pl.col("full").str.to_datetime(strict=False, time_unit="ns").dt.replace_time_zone("UTC")
    full_zoned = pl.col("fzone").is_in(["UTC", "GMT"])
    unix = pl.from_epoch(
        (pl.col("unix").cast(pl.Float64, strict=False) * 1e6).round().cast(pl.Int64), time_unit="us"
    ).dt.replace_time_zone("UTC")
    ts = pl.coalesce(ctime, iso_ts, stime, full, unix.dt.cast_time_unit("ns"))
    syslog = pl.col("stime") + pl.when(pl.col("sfrac").is_not_null()).then("." + pl.col("sfrac")).otherwise(pl.lit(""))
    recs = recs.with_columns(
        kind=classify(pl.col("body")),
        ts=ts,
        ts_text=pl.when(ts.is_not_null()).then(pl.coalesce("ctime", "iso", syslog, "full", "unix")),  # as printed
        printed_zone=(pl.col("iso").is_not_null() & iso_zoned)
        | (pl.col("full").is_not_null() & full_zoned)
        | pl.col("unix").is_not_null(),
        uptime_s=pl.coalesce(number(pl.col("up")), number(pl.col("kus")) / 1e6),
        syslog_host=pl.coalesce(
            "isohost", "monohost", "fullhost", "unixhost", pl.when(pl.col("tag").is_not_null()).then(pl.col("shost"))
        ),
        t=tag,
        xid=xid,
        message=pl.col("body"),
    ).with_columns(
        subsystem=pl.when(pl.col("body").str.starts_with("NVRM:"))
        .then(pl.lit("NVRM"))
        .otherwise(pl.col("t").struct.field("sub")),
        device=pl.coalesce(
            pl.col("body").str.extract(r"^NVRM: Xid \((?:PCI:)?([^)]*)\)", 1),
            pl.col("t").struct.field("pci"),
            pl.col("body").str.extract(r"error received: (\S+)", 1),
        ),
        netdev=pl.coalesce(
            pl.col("body").str.extract(r"NETDEV WATCHDOG: (\S+) \(", 1),
            pl.col("body").str.extract(r"ADDRCONF\(NETDEV_CHANGE\): ([^:\s]+):", 1),
            pl.when(pl.col("t").struct.field("pci").is_not_null()).then(pl.col("t").struct.field("nd")),
            pl.col("body").str.extract(r"^\w+: (\w[\w.@-]*): (?:NIC )?Link", 1),
        ),
    )
    return recs.with_columns(detail=_detail())


def _detail() -> pl.Expr:
    body, kind = pl.col("body"), pl.col("kind")
    meaning = pl.col("xid").replace_strict(
        XID_MEANINGS, default="unknown Xid (see NVIDIA's Xid catalog)", return_dtype=pl.String
    )
    return (
        pl.when(kind == "xid")
        .then(pl.format("Xid {}: {}", "xid", meaning))
        .when(kind == "pcie_aer")
        .then(body.str.extract(r"AER: (.+?) error received", 1))
        .when(kind == "oom_kill")
        .then(body.str.extract(r"Kill(?:ed)? process (\d+ \([^)]*\))", 1))
        .when(kind == "tx_timeout")
        .then(body.str.extract(r"(transmit queue \d+ timed out(?: \d+ ms)?|TX timeout.*)", 1))
        .when(kind == "soft_lockup")
        .then(body.str.extract(r"(CPU#\d+ stuck for \d+s!.*)", 1))
        .when(kind == "hung_task")
        .then(body.str.extract(r"INFO: task (\S+ blocked for more than \d+ seconds)", 1))
    )


def _chunk(
    sources: list[InputFile], chunk: pl.DataFrame, after_record: bool
) -> tuple[pl.DataFrame, dict[int, Account]]:
    """One chunk's kept records and accounts, by file: the chunk's lines carry `idx` (their file in
    `sources`) and `line` (its key, lines.FILE_SHIFT: several small files are one chunk, each after
    an empty row); `after_record`: a record came before this chunk (of a file read in chunks)."""
    years = {i: _year(source) for i, source in enumerate(sources)}
    lines = context(chunk.with_columns(year=pl.col("idx").replace_strict(years, return_dtype=pl.Int32)), over="idx")
    lines = lines.filter((pl.col("line") & LINE_MASK) > 0)  # not the empty rows between files
    recs = records(lines.filter(pl.col("ctx").is_null()), pl.col("year"))
    is_record = pl.col("line").is_in(recs["line"].implode())
    banner = pl.col("text").str.contains(_JOURNAL_BANNER)
    seen = is_record.shift(1).fill_null(after_record).cum_max().over("idx")
    continuation = pl.col("text").str.contains(r"^\s+\S") & seen  # indented under some record
    status = lines.select(
        pl.when(pl.col("ctx").is_not_null())
        .then(pl.col("ctx"))
        .when(is_record)
        .then(pl.lit(PARSED, pl.UInt8))
        .when(banner | continuation)
        .then(pl.lit(IGNORED, pl.UInt8))
    ).to_series()
    kept = recs.filter((pl.col("kind") != "other") | pl.col("subsystem").is_in(NOTED))
    names = pl.Series([source.name for source in sources], dtype=pl.String)
    frame = provenance(sources[0], kept, pl.col("ts")).with_columns(
        file=names.gather(kept["idx"]),
        line=pl.col("line") & LINE_MASK,
        host=pl.coalesce("syslog_host", "host"),
        zoned=pl.col("printed_zone").fill_null(False),
    )
    return frame.select(COLUMNS), accounts(lines.with_columns(pl.col("line") & LINE_MASK), status)


@input_format("kernel_log", priority=95, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    """Chunk by chunk (kernel logs run to gigabytes), or several small logs as one chunk: every line
    is counted, and the table keeps the records of the kinds above plus the other records of NIC and
    GPU drivers (NOTED), which say what sits at a PCI address; the rest of a kernel log is counted
    as parsed and not kept."""
    if len(sources) > 1:
        frame, found = _chunk(sources, read_files([source.path for source in sources]), False)
        return Batch(
            {"kernel_events": frame} if frame.height else {},
            {source.name: found.get(i, Account()) for i, source in enumerate(sources)},
        )
    frames, total, after_record = [], Account(), False
    for chunk in read_chunks(sources[0].path):
        frame, found = _chunk(sources, chunk.with_columns(idx=pl.lit(0, pl.Int64)), after_record)
        acc = found.get(0, Account())
        after_record = after_record or acc.parsed > 0
        frames += [frame] if frame.height else []
        merge(total, acc)
    tables = {"kernel_events": pl.concat(frames, how="diagonal_relaxed")} if frames else {}
    return Batch(tables, {sources[0].name: total})
