"""PyTorch's Flight Recorder analyzer output (torchfrtrace) pasted instead of dumps: the real text
it printed on the lab runs, and the older and error forms from its documented source (synthetic)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import FIXTURES
from tracelens.ingest import InputFile, sniff_format
from tracelens.ingest.hangs import fr_text


def _read(path: Path):
    assert sniff_format(path.read_bytes()[:65536]) == "fr_analyzer"
    return fr_text.ingest(InputFile(path, path.name, "fr_analyzer"))


def test_real_report_not_all_ranks_joining():
    result = _read(FIXTURES / "lab-hang-skip" / "torchfrtrace.txt")
    rows = result.tables["fr_entries"]
    in_pg1 = rows.filter(rows["pg_name"] == "1")
    assert sorted(in_pg1["rank"]) == [0, 1, 3] and set(in_pg1["collective_seq_id"]) == {6}
    assert set(in_pg1["op"]) == {"all_reduce"} and set(in_pg1["input_sizes"]) == {"[[1]]"}
    assert [(f["name"], f["line"]) for f in in_pg1["frames"][0]][2] == ("train", 110)
    in_pg0 = rows.filter(rows["pg_name"] == "0")
    assert in_pg0["rank"].to_list() == [2] and set(in_pg0["pg_desc"]) == {"default_pg"}
    assert result.tables["fr_groups"]["ranks"].to_list() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert result.account.unrecognized == 0 and result.account.parsed == result.account.lines == 32


def test_real_listing_side_by_side_plain_and_verbose():
    plain = _read(FIXTURES / "lab-hang-skip" / "torchfrtrace_j.txt").tables["fr_entries"]
    assert sorted(set(plain["rank"])) == [0, 1, 2, 3] and set(plain["encoding"]) == {"analyzer listing"}
    assert plain.filter(plain["rank"] == 2).sort("record_id")["input_sizes"][-1] == "[[128, 64]]"
    verbose = _read(FIXTURES / "lab-hang-skip" / "torchfrtrace_j_verbose.txt").tables["fr_entries"]
    rank2 = verbose.filter(verbose["rank"] == 2).sort("record_id")
    assert rank2["collective_seq_id"][-1] == 25 and rank2["pg_desc"][-1] == "default_pg"
    assert rank2["input_dtypes"][-1] == "['Float']"


def test_synthetic_older_and_error_forms(tmp_path):
    """2.5 printed `collective N at entry M` and the count of expected ranks; 2.6+ reports
    mismatches as `Collective sequence number: N has errors` with the culprit (built from
    EntryState.log and MatchInfo in torch/distributed/flight_recorder/components/types.py)."""
    text = tmp_path / "fr.txt"
    text.write_text(
        "Not all ranks joining collective 5 at entry 4\n"
        "group info: 0:default_pg\ncollective: nccl:all_reduce\nmissing ranks: {1}\n"
        "input sizes: [[3, 4]]\noutput sizes: [[3, 4]]\nexpected ranks: 2\ncollective state: scheduled\n"
        "collective stack trace: \n"
        " all_reduce at /usr/lib/torch/distributed/distributed_c10d.py:2501\nstep at /job/train.py:88\n"
        "\n"
        "Collective sequence number: 9 has errors\ninternal record id: 40\n"
        "group info: 3:tp_group\ncollective: nccl:all_gather\n"
        "input sizes: [[16]]\noutput sizes: [[64]]\nworld size: 4\n"
        "expected ranks: {0, 1, 2, 3}\ncollective state: started\n"
        "error msg: Culprit rank 2; Error type: COLLECTIVE_TYPE_MISMATCH, "
        "Expected collective type: 'all_gather' does not match "
        "found collective type: 'broadcast'\ncollective stack trace: \n gather_params at /job/model.py:12\n"
    )
    result = _read(text)
    rows = result.tables["fr_entries"].sort("collective_seq_id", "rank")
    old = rows.filter(rows["collective_seq_id"] == 5)
    assert old["rank"].to_list() == [0] and old["frames"][0][1]["line"] == 88  # expected 2 ranks, rank 1 missing
    err = rows.filter(rows["collective_seq_id"] == 9)
    assert err["rank"].to_list() == [0, 1, 2, 3] and err["op"].to_list() == [
        "all_gather",
        "all_gather",
        "broadcast",
        "all_gather",
    ]
    assert set(err["pg_desc"]) == {"tp_group"} and set(err["record_id"]) == {40}


def test_real_mismatch_report_reads_as_a_desync(tmp_path):
    """torchfrtrace on the size run's dumps (members: the ranks that dumped): `has errors`, culprit rank 2."""
    result = _read(FIXTURES / "lab-hang-size" / "torchfrtrace_dumped_ranks.txt")
    rows = result.tables["fr_entries"].sort("rank")
    assert rows["rank"].to_list() == [0, 2, 3] and set(rows["collective_seq_id"]) == {21}
    assert rows["input_sizes"].to_list() == ["[[128, 64]]", "[[8199]]", "[[128, 64]]"]
    (tmp_path / "fr.txt").write_bytes((FIXTURES / "lab-hang-size" / "torchfrtrace_dumped_ranks.txt").read_bytes())
    from tracelens.analyze import analyze

    desync = [f for f in analyze(tmp_path).findings if f.rule_id == "TL421"]
    assert desync and desync[0].ranks == [2] and "[[8199]]" in desync[0].summary


def test_real_report_of_a_killed_rank_names_it(tmp_path):
    """With a rank killed, torchfrtrace prints only `... we missed FR dumps from ranks ({2}) ...`."""
    result = _read(FIXTURES / "lab-hang-kill" / "torchfrtrace.txt")
    rows = result.tables["fr_entries"]
    assert set(rows["rank"]) == {2} and set(rows["status"]) == {"no dump"}
    (tmp_path / "torchfrtrace.txt").write_bytes((FIXTURES / "lab-hang-kill" / "torchfrtrace.txt").read_bytes())
    from tracelens.analyze import analyze

    (stop,) = [f for f in analyze(tmp_path).findings if f.rule_id == "TL422"]
    assert stop.ranks == [2] and "left no dump" in stop.summary


def test_report_behind_a_launcher_tag_or_the_root_loggers_prefix(tmp_path):
    real = (FIXTURES / "lab-hang-skip" / "torchfrtrace.txt").read_text().splitlines()
    plain = _read(FIXTURES / "lab-hang-skip" / "torchfrtrace.txt").tables["fr_entries"]
    for prefix in ("[rank0]:", "INFO:Flight Recorder:"):
        path = tmp_path / "pasted.txt"
        path.write_text("".join(f"{prefix}{line}\n" for line in real))
        rows = _read(path).tables["fr_entries"]
        cols = ["rank", "pg_name", "collective_seq_id", "op", "input_sizes"]
        assert rows.select(cols).equals(plain.select(cols))


def test_synthetic_block_head_with_a_colon(tmp_path):
    """`Not all ranks joining collective: sequence number: N`, as a public thread shows it (synthetic
    copy of that shape): read as the comma form is, every line of the block parsed."""
    text = tmp_path / "fr.txt"
    text.write_text(
        "Not all ranks joining collective: sequence number: 31117\ninternal record id: 31116\n"
        "group info: 0:default_pg\ncollective: nccl:all_reduce\nmissing ranks: {3, 4, 5, 6, 7}\n"
        "input sizes: [[1024]]\noutput sizes: [[1024]]\nworld size: 8\nexpected ranks: {0, 1, 2, 3, 4, 5, 6, 7}\n"
        "collective state: scheduled\ncollective stack trace:\n"
        " all_reduce at /usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py:2501\n"
        " train_step at /workspace/train.py:212\n"
    )
    result = _read(text)
    rows = result.tables["fr_entries"]
    assert sorted(rows["rank"]) == [0, 1, 2] and set(rows["collective_seq_id"]) == {31117}
    assert set(rows["state"]) == {"scheduled"}
    assert result.account.parsed == result.account.lines == 13
