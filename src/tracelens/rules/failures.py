"""TL107-TL111: what NCCL and PyTorch reported going wrong: IB completion errors,
collective timeouts, socket/bootstrap/proxy failures, CUDA/NVML/memory errors and IB async events."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from tracelens.derived import RunContext
from tracelens.findings import Finding, Severity
from tracelens.findings.evidence import evidence, hosts_of, ranks_of, time_window
from tracelens.prose import count, labelled, numbers_text
from tracelens.rules import rule

FLUSH = 5  # IBV_WC_WR_FLUSH_ERR: queued work flushed after an earlier error on the QP


def _count_list(frame: pl.DataFrame, column: str) -> str:
    """'12 x A, 3 x B' for the values of `column`, most frequent first."""
    counts = frame.group_by(column).len().sort(["len", column], descending=[True, False])
    return ", ".join(f"{r['len']} x {r[column]}" for r in counts.iter_rows(named=True))


@rule("TL107", "ib-completion-errors", Severity.CRITICAL, needs=("nccl_errors",))
def ib_completion_errors(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: NCCL `NET/IB : Got completion ... with error/status N` warnings, in every
    wording NCCL has used (2.3 to 2.30), grouped per host with the status names, peers and
    counts. Status 12 (IBV_WC_RETRY_EXC_ERR) means the NIC retransmitted until its retry
    count ran out; 5 (WR_FLUSH_ERR) follows an earlier error; 4, 10 and 13 are protection,
    remote access and receiver-not-ready failures.

    Why it slows the run: a completion error kills the queue pair, so the collective aborts
    and the job hangs until the watchdog fires or crashes; before that, the retries behind
    a status 12 already stalled the transfer for seconds each (4.096 us x 2^NCCL_IB_TIMEOUT
    per attempt, NCCL_IB_RETRY_CNT attempts).

    How to fix: status 12 right at start-up means the NICs cannot reach each other (RoCE GID
    index or traffic class wrong: set NCCL_IB_GID_INDEX to the RoCE v2 GID from `show_gids`,
    NCCL_IB_TC to the lossless class); later in the run it means packet loss: check the link
    from the peer's port with `perfquery -x` (SymbolErrorCounter, LinkDownedCounter,
    PortRcvErrors) and `ibstat`, reseat or replace the cable, check PFC/ECN on RoCE. Raising
    NCCL_IB_TIMEOUT (e.g. 22) and NCCL_IB_RETRY_CNT (max 7) only rides out short outages.
    """
    errors = ctx["nccl_errors"].filter(pl.col("kind") == "ib_completion")
    if errors.height == 0:
        return
    # PyTorch quotes NCCL's last WARN after `Last error:` (a row without a pid): the same error
    # counts once when NCCL's own WARN line is in the logs too.
    logged = errors.filter(pl.col("pid").is_not_null()).select("message").unique()
    errors = errors.filter(pl.col("pid").is_not_null() | ~pl.col("message").is_in(logged["message"].implode()))
    errors = errors.with_columns(
        status_label=pl.when(pl.col("status_name").is_not_null())
        .then(pl.format("{} ({})", "status_name", "status"))
        .otherwise(pl.format("status {}", pl.col("status").cast(pl.String).fill_null("?")))
    )
    for (host,), rows in errors.sort("file", "line").group_by(["host"], maintain_order=True):
        root = rows.filter(pl.col("status").fill_null(-1) != FLUSH)
        peers = sorted(set(rows["peer"].drop_nulls().to_list()))
        peer_text = f" with {labelled('peer', peers, 5)}" if peers else ""
        yield Finding(
            severity=Severity.CRITICAL,
            title="InfiniBand completion errors",
            summary=f"{count(rows.height, 'IB completion error')} on {host or 'an unnamed host'}{peer_text}: "
            f"{_count_list(rows, 'status_label')}."
            + (
                f" First non-flush error: {root['status_label'][0]}."
                if root.height and root.height < rows.height
                else ""
            ),
            evidence=evidence(rows),
            hosts=[host] if host else [],
            ranks=ranks_of(ctx, rows),
            window=time_window(rows),
        )


_TIMEOUT_KINDS = ["watchdog_timeout", "blocking_wait_timeout", "watchdog_exception", "watchdog_abort"]
_STUCK = "watchdog_stuck"  # the heartbeat monitor: the watchdog thread itself hung


@rule("TL108", "collective-timeout", Severity.CRITICAL, needs=("nccl_errors",))
def collective_timeout(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: PyTorch ProcessGroupNCCL watchdog timeouts (`Watchdog caught collective
    operation timeout: WorkNCCL(SeqNum=..., OpType=..., Timeout(ms)=...)`), blocking-wait
    timeouts, watchdog exceptions and the watchdog taking the process down ("Some NCCL
    operations have failed or timed out"), grouped per collective (operation and sequence
    number) with the ranks that reported it; and PyTorch's heartbeat monitor finding the
    watchdog thread itself stuck (`ProcessGroupNCCL's watchdog got stuck for 480 seconds`).

    Why it slows the run: a collective that never completes means some rank never joined it
    (crashed, stuck in data loading or in a different code path) or the network stopped
    delivering; every other rank sits idle for the whole timeout (often 10 or 30 minutes)
    before the job dies.

    How to fix: find the rank that did not reach the collective: compare the last lines each
    rank logged and the SeqNum each reports (a rank with a lower last-completed work is the
    one behind); enable the flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000,
    TORCH_NCCL_DUMP_ON_TIMEOUT=1) and NCCL_DEBUG=INFO; look for IB completion errors or link
    errors in the same minutes. Raising the timeout hides the cause. A stuck watchdog hangs
    in a CUDA or NCCL call (often `cudaEventDestroy` or an abort that never returns, or
    another thread holding the GIL): `py-spy dump --native` on the rank shows where.
    """
    stuck = ctx["nccl_errors"].filter(pl.col("kind") == _STUCK)
    if stuck.height:
        stuck = stuck.sort("file", "line")
        ranks = sorted(set(stuck["rank"].drop_nulls().to_list()))
        timeout = stuck["timeout_ms"].drop_nulls()
        after = f" for {int(timeout.max()) // 1000} s" if timeout.len() else ""
        summary = (
            f"PyTorch's heartbeat monitor found the NCCL watchdog thread stuck{after} on "
            f"{count(len(ranks), 'rank') if ranks else 'unnamed ranks'}"
            + (f" ({numbers_text(ranks)})" if ranks else "")
            + ": a CUDA or NCCL call hung, and the process was taken down."
        )
        yield _of_rows(ctx, "NCCL watchdog stuck", summary, stuck, ranks=ranks)
    rows = ctx["nccl_errors"].filter(pl.col("kind").is_in(_TIMEOUT_KINDS))
    if rows.height == 0:
        return
    # A watchdog exception line names only the sequence number; it belongs with the timeout of that work.
    rows = rows.with_columns(collective=pl.coalesce(pl.col("seq").cast(pl.String), pl.col("op_type"), pl.lit("?")))
    for _, group in rows.sort("file", "line").group_by(["collective"], maintain_order=True):
        seq = group["seq"].drop_nulls().first()
        op = group["op_type"].drop_nulls().first() or "collective"
        timeout = group["timeout_ms"].drop_nulls()
        ran = group["ran_ms"].drop_nulls()
        ranks = sorted(set(group["rank"].drop_nulls().to_list()))
        if group["kind"].eq("watchdog_abort").all():
            yield Finding(
                severity=Severity.CRITICAL,
                title="Collective failed or timed out",
                summary=f"PyTorch's NCCL watchdog took the process down after NCCL operations failed or timed out "
                f"({count(group.height, 'line')}); the log does not say which collective.",
                evidence=evidence(group),
                hosts=hosts_of(group),
                window=time_window(group),
            )
            continue
        what = f"{op} SeqNum={seq}" if seq is not None else op
        timing = ""
        if timeout.len():
            timing = f" after Timeout(ms)={int(timeout.max())}"
            if ran.len():
                timing += f" (ran up to {int(ran.max())} ms)"
        yield Finding(
            severity=Severity.CRITICAL,
            title=f"Collective timed out: {what}",  # which one: a run with several has them apart in the list
            summary=f"{what} timed out{timing}, reported by {count(len(ranks), 'rank') if ranks else 'unnamed ranks'}"
            + (f" ({numbers_text(ranks)})" if ranks else "")
            + f" in {count(group.height, 'line')}.",
            evidence=evidence(group),
            hosts=hosts_of(group),
            ranks=ranks,
            window=time_window(group),
        )


_FAILURE_KINDS = {
    "socket": "socket connection failures",
    "bootstrap": "bootstrap failures",
    "proxy": "proxy thread failures",
    "nccl_runtime_error": "errors raised to PyTorch",
    "version_mismatch": "NCCL version mismatches",
    "verbs_call": "IB verbs call failures",
    "ib_device": "IB device errors",
    "plugin": "network plugin failures",
}


@rule("TL109", "nccl-communication-failure", Severity.CRITICAL, needs=("nccl_errors|nccl_events",))
def communication_failure(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: NCCL failures outside the data path: socket connects refused or aborted,
    connections closed by the remote peer, bootstrap errors, proxy-thread failures, IB verbs
    calls that failed (`ibv_create_qp`, `ibv_modify_qp`), a network plugin that could not start
    (aws-ofi-nccl's `NET/OFI No NIC info for dev 0`, `Couldn't open AV`), and the `NCCL error in:
    ... unhandled system error` errors PyTorch raises from them. CUDA, NVML and out-of-memory
    errors are not network failures (TL110), nor are IB async events (TL111). Connections
    from something that is not NCCL (`socketFinalizeAccept: wrong magic`: a port scanner or
    an HTTP health check reaching an NCCL port) are reported apart, as information: NCCL
    drops them and goes on.

    Why it slows the run: the communicator cannot be built or is torn down, so the job fails
    at start-up or hangs at its next collective; these lines usually name the first rank and
    peer that broke, which is where the search should start.

    How to fix: read the first failure in time: `Connect to <ip> failed` points at a firewall,
    a wrong NCCL_SOCKET_IFNAME or an unreachable address; `Connection closed by remote peer`
    means the peer process died first (look at its log); `ibv_modify_qp failed` with
    `Network is unreachable` or a timeout means a wrong RoCE GID (NCCL_IB_GID_INDEX) or a
    port that is down (`ibstat`); `Call to ibv_create_cq failed ... Cannot allocate memory`
    points at the locked-memory limit (`ulimit -l unlimited`, `--ulimit memlock=-1` in
    containers). A plugin failure (`NET/OFI ...`) means the EFA/libfabric stack is missing
    or mismatched: check `fi_info -p efa`, the aws-ofi-nccl and libfabric versions, and that
    the EFA devices are passed into the container.
    """
    yield from _per_kind(ctx, _FAILURE_KINDS, lambda kind: f"NCCL {_FAILURE_KINDS[kind]}", "")
    foreign = ctx["nccl_errors"].filter(pl.col("kind") == "foreign_connection")
    if foreign.height:
        summary = (
            f"{count(foreign.height, 'connection')} with the wrong magic on {_hosts_text(foreign)}: something that "
            "is not NCCL (a port scanner, an HTTP health check) connected to an NCCL port; NCCL dropped it. "
            "Not a failure by itself."
        )
        yield _of_rows(
            ctx, "Connections from outside NCCL reached its ports", summary, foreign.sort("file", "line"), Severity.INFO
        )


def _per_kind(ctx: RunContext, kinds: dict[str, str], title, note: str) -> Iterator[Finding]:
    """One finding per error kind in `kinds`: how many, on how many hosts, and the first message."""
    rows = ctx["nccl_errors"].filter(pl.col("kind").is_in(list(kinds)))
    for (kind,), group in rows.sort("file", "line").group_by(["kind"], maintain_order=True):
        first = (group["message"][0] or "")[:160]
        summary = f"{group.height} {kinds[kind]} on {_hosts_text(group)}{note}; first: {first}"
        yield _of_rows(ctx, title(kind), summary, group)


def _hosts_text(rows: pl.DataFrame) -> str:
    hosts = hosts_of(rows)
    return count(len(hosts), "host") if hosts else "unnamed hosts"


def _of_rows(
    ctx: RunContext,
    title: str,
    summary: str,
    group: pl.DataFrame,
    severity: Severity = Severity.CRITICAL,
    ranks: list[int] | None = None,
) -> Finding:
    """A finding whose evidence, hosts, ranks (unless given) and time window are those of `group`'s lines."""
    return Finding(
        severity=severity,
        title=title,
        summary=summary,
        evidence=evidence(group),
        hosts=hosts_of(group),
        ranks=ranks_of(ctx, group) if ranks is None else ranks,
        window=time_window(group),
    )


_GPU_KINDS = {"cuda": "CUDA errors", "nvml": "NVML (GPU management library) errors", "oom": "GPU out-of-memory errors"}


@rule("TL110", "cuda-gpu-error", Severity.CRITICAL, needs=("nccl_errors|nccl_events",))
def gpu_error(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: CUDA, NVML and out-of-memory errors that NCCL or PyTorch reported:
    `Cuda failure 'invalid device function'`, `unhandled cuda error` (ncclUnhandledCudaError)
    raised to PyTorch, `CUDA error: an illegal memory access was encountered`, `NVML failure`,
    `Cuda failure 'out of memory'`, `torch.OutOfMemoryError: CUDA out of memory`. These are
    GPU, driver or build problems, not network failures.

    Why it slows the run: the rank that hit it dies or its communicator aborts, and every
    other rank waits in its next collective until the watchdog fires: the hang looks like a
    network problem although the network is fine.

    How to fix: `invalid device function` means NCCL (or PyTorch) was built without the GPU's
    architecture: compare `nvidia-smi --query-gpu=compute_cap --format=csv` with
    `python -c "import torch; print(torch.cuda.get_arch_list())"` and install a build for it.
    `out of memory`: lower the micro-batch size, enable activation checkpointing or ZeRO
    offload, leave room for NCCL's buffers (NCCL_BUFFSIZE, fewer channels via
    NCCL_MAX_NCHANNELS). NVML failures and illegal memory accesses: check `nvidia-smi` and
    `dmesg` for Xid errors, a driver/library version mismatch (reboot after a driver update),
    and rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel.
    """
    yield from _per_kind(ctx, _GPU_KINDS, _GPU_KINDS.get, ", a GPU or build problem, not the network")


# ibv_event_type texts (ibv_event_type_str) by what they break (the subnet manager's own events,
# which break nothing, are read apart: ib_sm_event).
_ASYNC_CLASSES = [
    ("port error", r"port error"),
    ("QP fatal", r"work queue|QP|path migration error|SRQ"),
    ("CQ error", r"CQ error"),
    ("device fatal", r"local catastrophic error|device fatal|communicator fatal"),
]


def _async_class(text: pl.Expr) -> pl.Expr:
    expr = pl.lit(None, dtype=pl.String)
    for name, pattern in reversed(_ASYNC_CLASSES):
        expr = pl.when(text.str.contains(f"(?i){pattern}")).then(pl.lit(name)).otherwise(expr)
    return expr.fill_null(pl.lit("other event"))


@rule("TL111", "ib-async-events", Severity.CRITICAL, needs=("nccl_errors|nccl_events",))
def ib_async_events(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: InfiniBand asynchronous events NCCL reported (`NET/IB : mlx5_0:1 async fatal
    event: port error`, `... async fatal event on QP (0x..): local access violation work queue
    error`, `Got async event : CQ error`, `local catastrophic error`) and the `communicator
    encountered a fatal error` that follows them in NCCL 2.26+, grouped per host and class:
    port error, QP fatal, CQ error, device fatal.

    Why it slows the run: the event kills the queue pair, the completion queue or the whole
    HCA: every transfer on it stops, the communicator aborts and the ranks that use it hang
    until the watchdog fires.

    How to fix: a port error means the link went down: `ibstat` (State, Physical state),
    `perfquery -x` (LinkDownedCounter, SymbolErrorCounter), the switch port's log, then reseat
    or replace the cable or transceiver. QP/CQ fatal and local access violations point at the
    driver or firmware (`dmesg` for mlx5 errors, `mlxfwmanager` for the firmware level) or at
    memory registration with GPUDirect (nvidia-peermem loaded, NCCL_NET_GDR_LEVEL).
    A device fatal (local catastrophic error) needs the HCA reset: `mlxfwreset` or a reboot.
    Subnet-manager events (`client reregistration`, `LID change`, `SM change`) follow an SM
    restart or handover and are not failures: they are reported as information.
    """
    sm = ctx["nccl_errors"].filter(pl.col("kind") == "ib_sm_event").sort("file", "line")
    if sm.height:
        summary = (
            f"{count(sm.height, 'subnet-manager event')} on {_hosts_text(sm)} ({_count_list(sm, 'async_event')}): "
            "the subnet manager restarted or handed over; not a failure."
        )
        yield _of_rows(ctx, "InfiniBand subnet-manager events", summary, sm, Severity.INFO)
    rows = ctx["nccl_errors"].filter(pl.col("kind") == "ib_async_event")
    if rows.height == 0:
        return
    rows = rows.with_columns(event_class=_async_class(pl.coalesce("async_event", "message")))
    for (host,), group in rows.sort("file", "line").group_by(["host"], maintain_order=True):
        first = group.row(0, named=True)
        summary = (
            f"{group.height} IB async event(s) on {host or 'an unnamed host'}: {_count_list(group, 'event_class')}; "
            f"first: {(first['async_event'] or first['message'] or '')[:120]}"
        )
        yield _of_rows(ctx, "InfiniBand async error events", summary, group)
