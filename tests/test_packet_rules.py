"""TL301-TL305 on synthetic captures (no public capture has NAKs, CNPs or CE marks): each fault fires
exactly its rule, on the right QP and hosts; the clean captures fire nothing."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from synth import pcap as synth
from tracelens.derived import RunContext
from tracelens.derived.flows import analyze
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
from tracelens.rules import all_rules
from tracelens.tables import RunTables

QP = synth.RoceQp()
# healthy, and its PSNs wrap past 2^24
OTHER_QP = synth.RoceQp(
    requester="10.0.0.3", responder="10.0.0.2", requester_qp=0x21, responder_qp=0x99, first_psn=0xFFFF00
)


def tables(tmp_path: Path, *conversations: list, nccl_net: list[dict] | None = None) -> RunTables:
    frames = sorted((f for c in conversations for f in c), key=lambda f: f.time)
    path = synth.write(tmp_path / "capture.pcap", frames)
    t = RunTables()
    t.add("packets", pcap.ingest(InputFile(path, path.name, "pcap")).tables["packets"])
    if nccl_net:
        t.add("nccl_net", pl.DataFrame(nccl_net))
    return t


def fired(t: RunTables) -> dict[str, list]:
    ctx = RunContext(t)
    runs = {r.id: r.run(ctx) for r in all_rules() if r.id.startswith("TL3")}
    return {rule_id: findings for rule_id, findings in runs.items() if findings}


def healthy_other_qp() -> list:
    return synth.roce_conversation(OTHER_QP, messages=400)


def test_clean_roce_and_tcp_fire_nothing(tmp_path):
    assert fired(tables(tmp_path, synth.roce_conversation(), healthy_other_qp(), synth.tcp_stream())) == {}


def test_loss_fires_tl301_on_the_lossy_qp_only(tmp_path):
    t = tables(tmp_path, synth.roce_conversation(faults=synth.RoceFaults(lost=(50, 200))), healthy_other_qp())
    found = fired(t)
    assert list(found) == ["TL301"]
    (finding,) = found["TL301"]
    assert finding.summary.startswith(
        "QP 0x000048 from 10.0.0.1 to 10.0.0.2: 2 NAKs with PSN sequence error "
        "and 2 missing PSNs in 402 packets; 4 packets (4,096 payload bytes) resent, "
        "0.012 ms from NAK to resend at 2023-11-14 22:13:20 UTC."
    )
    assert finding.hosts == ["10.0.0.1", "10.0.0.2"]
    assert [e.text.split(":")[0] for e in finding.evidence][:4] == [
        "PSN gap",
        "NAK (PSN sequence error)",
        "RoCE retransmission",
        "RoCE retransmission",
    ]
    assert all(e.frame and e.file == "capture.pcap" for e in finding.evidence)


def test_rnr_fires_tl302_naming_the_receiver_side(tmp_path):
    found = fired(tables(tmp_path, synth.roce_conversation(faults=synth.RoceFaults(rnr=(100,))), healthy_other_qp()))
    assert list(found) == ["TL302"]
    (finding,) = found["TL302"]
    assert "QP 0x000048 from 10.0.0.1 to 10.0.0.2: 1 RNR NAK from" in finding.summary
    qp = analyze(tables(tmp_path, synth.roce_conversation(faults=synth.RoceFaults(rnr=(100,))))["packets"]).qps.row(
        0, named=True
    )
    assert qp["nak_to_resend_ms"] == pytest.approx(synth.RNR_DELAY * 1e3, rel=0.01)


def test_cnp_burst_fires_tl303(tmp_path):
    burst = synth.RoceFaults(congested=tuple(range(100, 140)))
    found = fired(tables(tmp_path, synth.roce_conversation(faults=burst), healthy_other_qp()))
    assert list(found) == ["TL303"]
    (finding,) = found["TL303"]
    assert (
        "QP 0x000048 from 10.0.0.1 to 10.0.0.2: 40 of 400 data packets ECN-CE marked (10.0%) and 40 CNPs"
        in finding.summary
    )


def test_a_few_ce_marks_stay_below_the_congestion_share(tmp_path):
    assert fired(tables(tmp_path, synth.roce_conversation(faults=synth.RoceFaults(congested=(5, 6))))) == {}


def test_tcp_losses_fire_tl304(tmp_path):  # 200 segments, 3 lost and fast-retransmitted: 1.5%
    found = fired(tables(tmp_path, synth.tcp_stream(lost=(20, 60, 100))))
    assert list(found) == ["TL304"]
    (finding,) = found["TL304"]
    assert finding.summary.startswith(
        "10.0.1.1 to 10.0.1.2: 3 of 204 data segments retransmitted (1.5%, as tshark counts "
        "them), 3 of them after a loss (1.47%, 3 fast); not counted as loss: 0 tail-loss probes "
        "and 0 spurious retransmissions; 3,000 bytes resent over 1 connection, 0 zero windows"
    )
    assert finding.severity.label == "critical"  # 1% and more: a seventh of the throughput (Mathis)


def test_half_a_percent_loss_is_a_warning(tmp_path):  # what the real 4-connection capture showed
    found = fired(tables(tmp_path, synth.tcp_stream(segments=1000, lost=(100, 300, 500, 700, 900))))
    (finding,) = found["TL304"]
    assert finding.severity.label == "warning" and "5 of 1,004" not in finding.summary and "(0.50%" in finding.summary


def test_one_retransmission_is_not_a_rate(tmp_path):
    assert fired(tables(tmp_path, synth.tcp_stream(lost=(20,)))) == {}


def test_mirrored_capture_is_noted_as_duplicates_only(tmp_path):
    found = fired(tables(tmp_path, synth.tcp_stream(mirrored=True)))
    assert list(found) == ["TL305"]
    assert found["TL305"][0].summary.startswith("capture.pcap: 201 of 604 frames are capture duplicates")


def test_hosts_named_from_nccl_interfaces(tmp_path):
    net = [
        {"what": "oob_if", "name": "eth0", "address": "10.0.0.1<0>", "host": "node01"},
        {"what": "bootstrap_if", "name": "eth0", "address": "10.0.0.2", "host": "node02"},
    ]
    t = tables(tmp_path, synth.roce_conversation(faults=synth.RoceFaults(lost=(50,))), nccl_net=net)
    (finding,) = fired(t)["TL301"]
    assert finding.hosts == ["node01", "node02"]
    assert "from node01 (10.0.0.1) to node02 (10.0.0.2)" in finding.summary


def test_rule_docs_have_three_parts():
    for r in all_rules():
        if r.id.startswith("TL3"):
            assert set(r.docs) == {"What it finds", "Why it slows the run", "How to fix"}


@pytest.mark.parametrize("congested_first", [True, False])
def test_cnp_attribution_does_not_depend_on_which_qp_comes_first(tmp_path, congested_first):
    # Two QPs join the same hosts and only one is congested. A CNP carries no PSN of the flow,
    # so it must be matched through the requester QP its ACKs are addressed to too.
    burst = synth.RoceFaults(congested=tuple(range(100, 140)))
    qps = [synth.RoceQp(requester_qp=0x77 + i, responder_qp=0x60 + i, first_psn=0x100000 * (i + 1)) for i in range(2)]
    hot, cold = (0, 1) if congested_first else (1, 0)
    conversations = [synth.roce_conversation(qps[hot], faults=burst), synth.roce_conversation(qps[cold])]
    rows = {row["qp"]: row for row in analyze(tables(tmp_path, *conversations)["packets"]).qps.iter_rows(named=True)}
    assert rows[qps[hot].responder_qp]["cnps"] == 40
    assert rows[qps[cold].responder_qp]["cnps"] == 0


def test_one_flow_captured_at_both_ends_is_not_one_stream_of_resends(tmp_path):
    # tcpdump on the sender and on the receiver: the same segments in two files, the receiver's copy
    # later by the link latency. Merged into one stream, every segment would look retransmitted.
    stream = synth.tcp_stream(lost=())
    sender = synth.write(tmp_path / "sender.pcap", stream)
    for packet in stream:
        packet.time += 0.002  # 2 ms later: past the duplicate window, as a resend would be
    receiver = synth.write(tmp_path / "receiver.pcap", stream)
    t = RunTables()
    for path in (sender, receiver):
        t.add("packets", pcap.ingest(InputFile(path, path.name, "pcap")).tables["packets"])
    flows = analyze(t["packets"]).tcp
    assert flows["file"].n_unique() == 2
    assert flows["retransmissions"].sum() == 0
    assert fired(t) == {}
