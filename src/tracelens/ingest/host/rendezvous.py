"""How the job's processes found each other, into `rendezvous`, as a line parser of the shared
text-log pass: which host ran PyTorch's c10d store and the address the others reached it at, and the
master address the launchers hand every rank. derived/hosts.py ties a host to its address with them.

grammars/rendezvous.lark is the spec; the fragments are found inside any line (after a c10 log
prefix, a launcher's tag, in the middle of a command line) with the equivalent vectorized regexes:
- `[c10d - debug] The server has started on port = 29511.` (TCPStore.cpp, with
  TORCH_CPP_LOG_LEVEL=INFO): this process runs the store (`store_server`, port);
- `[c10d - debug] TCP client connected to host 10.99.0.1:29511`: the store's address as the
  process reached it (`store_client`, address, port);
- `--master_addr=10.0.0.1` or `--master_addr 10.0.0.1` (DeepSpeed's runner and launcher, torchrun,
  which also takes `--master-addr`), `MASTER_ADDR=10.0.0.1` (an environment echo; torchrun's
  `PET_MASTER_ADDR=` too), `master_addr: 10.0.0.1` (DDP's logger): the address of the host of
  global rank 0 (`master`, address, and the port where the line gives it).
"""

from __future__ import annotations

import polars as pl

from tracelens.ingest import IngestResult, InputFile, line_format
from tracelens.ingest.text.lines import NOT_MINE, PARSED
from tracelens.tables import PROVENANCE_COLUMNS

_C10D = r"\[c10d(?: - debug)?\] "
_ADDRESS = r"(?P<address>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)"
SERVER = _C10D + r"The server has started on port = (?P<port>\d+)\."
CLIENT = _C10D + r"TCP client connected to host " + _ADDRESS + r":(?P<port>\d+)"
MASTER = r"(?:--master[_-]addr[= ]|MASTER_ADDR=|master_addr: )['\"]?" + _ADDRESS
MASTER_PORT = r"(?:--master[_-]port[= ]|MASTER_PORT=|master_port: )['\"]?(\d+)"
# Every line the parser may claim holds one of these.
CANDIDATE = r"\[c10d|master[_-]addr|MASTER_ADDR"

COLUMNS = ["role", "address", "port"]


@line_format("rendezvous", candidates=(CANDIDATE,))
class RendezvousParser:
    """Claims the store and master-address lines of a text log; `finish` adds their rows."""

    def __init__(self, source: InputFile) -> None:
        self.source = source
        self.parts: list[pl.DataFrame] = []

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        status = pl.repeat(NOT_MINE, chunk.height, dtype=pl.UInt8, eager=True)
        candidate = chunk["text"].str.contains(CANDIDATE)
        if not candidate.any():
            return status
        text, rows = pl.col("text"), candidate.arg_true()
        server, client, master = (text.str.extract_groups(p) for p in (SERVER, CLIENT, MASTER))
        found = chunk[rows].select(
            "line",
            role=pl.when(server.struct.field("port").is_not_null())
            .then(pl.lit("store_server"))
            .when(client.struct.field("port").is_not_null())
            .then(pl.lit("store_client"))
            .when(master.struct.field("address").is_not_null())
            .then(pl.lit("master")),
            address=pl.coalesce(client.struct.field("address"), master.struct.field("address")).str.strip_chars("[]"),
            port=pl.coalesce(
                server.struct.field("port"), client.struct.field("port"), text.str.extract(MASTER_PORT, 1)
            ).cast(pl.Int64, strict=False),
        )
        mine = found["role"].is_not_null()
        if not mine.any():
            return status
        self.parts.append(found.filter(mine))
        return status.scatter(rows.filter(mine), PARSED)

    def finish(self, result: IngestResult) -> None:
        if not self.parts:
            return
        rows = pl.concat(self.parts).with_columns(
            file=pl.lit(self.source.name),
            host=pl.lit(None, pl.String),
            ts=pl.lit(None, pl.Datetime("ns", "UTC")),
            ts_quality=pl.lit("none"),
            ts_text=pl.lit(None, pl.String),  # the c10 prefix's time has no year: the store's lines need none
        )
        result.add("rendezvous", rows.select(*PROVENANCE_COLUMNS, *COLUMNS))
