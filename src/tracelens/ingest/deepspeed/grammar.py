"""The kinds of DeepSpeed message bodies: how each is recognised by its first words (HEADS) and
how the grammar (grammars/deepspeed.lark) reads the bodies that are not read by deepspeed's
vectorized regexes, into dicts of fields. Shared by the line parser (deepspeed) and the assembly
of a file's tables (assemble), which reads zero_config's Python repr with it.
"""

from __future__ import annotations

from functools import cache

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from tracelens.ingest.text.lines import checked_float
from tracelens.resources import grammar_text

# kind -> (first words of its body, printed without a logger prefix by some version)
HEADS: dict[str, tuple[str, bool]] = {
    "progress": (r"^(?:rank:\d+ )?step=\d+, skipped=", False),
    "timers": (r"^(?:rank=-?\d+ )?time \(ms\) \| ", True),
    "throughput": (r"^(?:epoch=\d+/micro_step=\d+/global_step=\d+|\d+/\d+), (?:RunningAvg)?SamplesPerSec=", False),
    "pipe_step": (r"^steps: \d+ loss: ", True),
    "iteration": (r"^ *iteration +\d+/ *\d+ \|", True),
    "comm_op": (r"^(?:rank=-?\d+ \| )?comm op: ", False),
    "overflow": (
        r"^(?:\[deepspeed\] OVERFLOW! |Overflow detected\. |(?:Reducing|Increasing) dynamic loss scale "
        r"|No Grad overflow for |Grad overflow on iteration )",
        True,
    ),
    "chatter": (r"^(?:Process \d+ exits |Setting ds_accelerator to )", False),
    "comms_header": (r"^Comm\. Op {2,}Message Size", True),
    "config_header": (r"^DeepSpeed(?:Engine|Light) configuration:", True),
    "config_entry": (r"^  [A-Za-z_]\w*(?: \.{2,}| {2}\S| = )", False),
    "zero_init": (r"^(?:Reduce bucket size|Allgather bucket size|CPU Offload:) ", False),
    "version": (r"^DeepSpeed info: version=", True),
    "launcher": (
        r"^(?:WORLD INFO DICT: |nnodes=\d|global_rank_mapping=|dist_world_size=\d|Setting CUDA_VISIBLE_DEVICES="
        r"|process \d+ spawned with command: |cmd ?= ?|Running on the following workers: "
        r"|\d+ (?:NCCL|UCX|FI|CUDA|TORCH)_\w+[ =])",
        True,
    ),
}
SIZE_UNITS = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"]  # comms_logging.convert_size, 1024-based

KINDS = [*HEADS, "comms_op", "comms_row", "straggler_banner", "pyrepr"]


class Record(Transformer):
    """Parse tree -> dict. A rule holding one value is a field `(name, value)`; a kind, or any
    rule holding fields, is a record whose fields merge into one dict."""

    def __default__(self, data, children, meta):
        if data not in KINDS and len(children) == 1 and not isinstance(children[0], (tuple, dict)):
            return (str(data), _value(children[0]))
        record: dict = {}
        for child in children:
            if isinstance(child, tuple):
                record[child[0]] = child[1]
            elif isinstance(child, dict):
                record.update(child)
        return record

    def list(self, children):
        return [_value(c) for c in children if c is not None]

    tuple = pylist = list

    def pydict(self, children):
        values = self.list(children)
        return dict(zip(values[::2], values[1::2]))

    def timer(self, children):
        return (str(children[0]), checked_float(children[1]))

    def mfield(self, children):
        return (children[0].strip(), children[1].strip())

    def kwarg(self, children):
        return (str(children[0]), _value(children[1]))

    def call(self, children):
        return dict(c for c in children if isinstance(c, tuple))

    def pyrepr(self, children):
        return dict(children)

    def msg_size(self, children):
        return ("msg_bytes", round(checked_float(children[0]) * 1024 ** SIZE_UNITS.index(str(children[1]))))

    def latency_columns(self, _):
        return ("straggler", False)

    def straggler_columns(self, _):
        return ("straggler", True)


def _value(item):
    if not isinstance(item, Token):
        return item
    if item.type == "INT":
        return int(item)
    if item.type == "NUMBER":
        return checked_float(item)
    if item.type in ("PYNUMBER", "BIG_INT"):
        text = item.replace(",", "")
        return int(text) if text.lstrip("-").isdigit() else float(text)
    if item.type == "STRING":
        return item[1:-1]
    return str(item)


@cache
def grammar() -> Lark:
    return Lark(grammar_text("deepspeed"), parser="lalr", start=KINDS)


def parse_body(kind: str, body: str) -> dict | None:
    """The fields of one body of `kind` by the grammar, or None when it does not parse."""
    try:
        return Record().transform(grammar().parse(body, start=kind))
    except (UnexpectedInput, VisitError):
        return None
