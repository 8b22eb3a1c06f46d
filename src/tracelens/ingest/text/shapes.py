"""Parse message bodies by shape: the grammar once per shape, the values back by position.

A large job prints one distinct body per rank, channel and peer (`Trees [0] 12/-1/-1->5->3`,
`Bootstrap : Using eth0:10.0.3.17<0>`), and a lark parse per body would cost the most of all. What
repeats is the body's *shape*: the body with its numbers and hex ids masked. This module
masks every body (vectorized), parses one representative body per new shape with the
grammar, and records where each field's text lies in it: literal text and token positions (a
*recipe*). Every other body of the shape gets its fields by gathering the same token
positions with polars list operations, so the grammar's cost follows the number of shapes (a
few hundred in a real log), not the number of bodies.

The grammar stays the spec. A field whose text does not start and end on token boundaries (a
terminal that splits a number) leaves its shape without recipes: those bodies get no kind here
and the caller parses them one by one. Tests prove the shape path equal to the
grammar on every corpus body and on generated bodies of every kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl
from lark import Token

TOKEN = r"0x[0-9a-fA-F]+|\d+"  # the variable tokens: hex ids and pointers, then any run of digits
_MASK = r"(0x)[0-9a-fA-F]+|\d+"  # the same tokens, the 0x kept so that a shape tells the two apart
MARK = "\ue000"  # stands for a token in a shape; a body holding it is left to the grammar
_HEX_MARK = "\ue001"  # a hex token while a body is masked
_HEX_AFTER_DIGIT = r"\d0x[0-9a-fA-F]|\ue001"  # bodies where masking hex tokens first would differ from _MASK
MAX_PROBES = 32  # tokens probed one by one to find those the grammar needs as they are
# Bodies longer than this are left to the grammar: a shape's fields are gathered one expression per
# token, and a body of a MiB (records glued into one line) has tens of thousands of tokens.
MAX_SHAPE_BYTES = 16 << 10

Piece = str | int  # literal text, or the position of a token in the body
Recipe = tuple[Piece, ...]


class NoRecipe(ValueError):
    """A field's text does not start and end on token boundaries."""


@dataclass(frozen=True)
class Shape:
    """What the grammar said about one representative body: its kind and its fields' recipes."""

    kind: str
    fields: dict[str, Recipe | list[Recipe]]
    fixed: dict[int, str]  # token position -> the text it must have for the shape to hold


class Locator:
    """Recipes for the fields of one body: where a field's text lies among its literal text and tokens."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.spans = [m.span() for m in re.finditer(TOKEN, body)]

    def __call__(self, tokens: Sequence[Token]) -> Recipe:
        """The recipe of the text `" ".join(str(t).strip() for t in tokens)` (how a field's text is made)."""
        pieces: list[Piece] = []
        for n, token in enumerate(tokens):
            if n:
                pieces.append(" ")
            pieces.extend(self._one(token))
        recipe = _merge(pieces)
        if self.text(recipe, [self.body[s:e] for s, e in self.spans]) != " ".join(str(t).strip() for t in tokens):
            raise NoRecipe(f"recipe does not rebuild its field in {self.body!r}")
        return recipe

    def _one(self, token: Token) -> list[Piece]:
        start, end = token.start_pos, token.end_pos
        if start is None or end is None or self.body[start:end] != str(token):
            raise NoRecipe(f"token {token!r} has no position in {self.body!r}")
        text = self.body[start:end]
        start += len(text) - len(text.lstrip())
        end -= len(text) - len(text.rstrip())
        pieces: list[Piece] = []
        at = start
        for i, (s, e) in enumerate(self.spans):
            if e <= start or s >= end:
                continue
            if s < start or e > end:
                raise NoRecipe(f"field {text!r} cuts a token in {self.body!r}")
            pieces += [self.body[at:s], i]
            at = e
        pieces.append(self.body[at:end])
        return pieces

    @staticmethod
    def text(recipe: Recipe, tokens: Sequence[str]) -> str:
        return "".join(p if isinstance(p, str) else tokens[p] for p in recipe)


_SHIFT = str.maketrans("0123456789", "1234567890")


def _shifted(text: str) -> str:
    """A token with each digit shifted by one (0x kept): same length, same class, another value."""
    return text[:2] + text[2:].translate(_SHIFT) if text.startswith("0x") else text.translate(_SHIFT)


def _texts(recipes: dict, tokens: Sequence[str]) -> dict:
    """Field texts from recipes and a body's tokens."""
    return {
        name: [Locator.text(r, tokens) for r in recipe] if isinstance(recipe, list) else Locator.text(recipe, tokens)
        for name, recipe in recipes.items()
    }


def _merge(pieces: list[Piece]) -> Recipe:
    """Adjacent literals joined, empty ones dropped."""
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return tuple(out)


# parse(body, locator) -> (kind, fields) with each field's text replaced by its recipe
ParseRecipes = Callable[[str, Locator], tuple[str, dict]]


class ShapeParser:
    """Kinds and fields of many bodies, the grammar run once per shape (cached across chunks)."""

    def __init__(self, parse: ParseRecipes) -> None:
        self._parse = parse
        self.shapes: dict[str, Shape | None] = {}  # shape -> what its representative parsed to; None: no recipes

    def learn(self, body: str) -> Shape | None:
        """Parse a shape's representative body; None if the grammar tells its values apart.

        A digit can be part of a name the grammar spells out (`P2P Chunksize`, `4 p2p channels`,
        `NCCL_BLOCKING_WAIT=1`), so the shape must also hold for a *probe*: the body with every
        digit shifted by one, which the grammar must read as the same kind with the fields the
        recipes give. If it does not, each token is probed alone, and those the grammar needs as
        they are become *fixed*: the shape holds only for bodies with the same text there.
        """
        locate = Locator(body)
        try:
            kind, recipes = self._parse(body, locate)
        except NoRecipe:
            return None
        count = len(locate.spans)
        fixed: set[int] = set()
        if not self._holds(locate, kind, recipes, fixed):
            if count > MAX_PROBES:
                return None
            fixed = {i for i in range(count) if not self._holds(locate, kind, recipes, set(range(count)) - {i})}
            if not fixed or not self._holds(locate, kind, recipes, fixed):
                return None
        return Shape(kind, recipes, {i: body[slice(*locate.spans[i])] for i in sorted(fixed)})

    def _holds(self, locate: Locator, kind: str, recipes: dict, fixed: set[int]) -> bool:
        """Whether the grammar reads the body with its tokens shifted (except `fixed`) as the recipes say."""
        body, pieces, at = locate.body, [], 0
        for i, (s, e) in enumerate(locate.spans):
            pieces += [body[at:s], body[s:e] if i in fixed else _shifted(body[s:e])]
            at = e
        probe = "".join(pieces) + body[at:]
        try:
            probe_kind, probe_recipes = self._parse(probe, Locator(probe))
        except NoRecipe:
            return False
        tokens = [probe[s:e] for s, e in Locator(probe).spans]
        return probe_kind == kind and _texts(probe_recipes, tokens) == _texts(recipes, tokens)

    def classify(self, bodies: pl.Series) -> tuple[pl.Series, pl.DataFrame]:
        """The kind of each body (null where a shape could not tell: the caller asks the grammar), and
        the fields of the bodies that have some (column `row` = position in `bodies`, one column per field)."""
        body = pl.col("body")
        frame = (
            pl.DataFrame({"body": bodies})
            .with_row_index("row")
            .with_columns(
                shape=pl.when(body.str.contains(MARK, literal=True) | (body.str.len_bytes() > MAX_SHAPE_BYTES))
                .then(None)
                .otherwise(pl.lit(masked(bodies)))
            )
        )
        firsts = frame.filter(pl.col("shape").is_not_null()).unique("shape", keep="first", maintain_order=True)
        for shape, first in zip(firsts["shape"].to_list(), firsts["body"].to_list()):
            if shape not in self.shapes:
                self.shapes[shape] = self.learn(first)
        known = {t: self.shapes[t] for t in firsts["shape"].to_list()}
        kinds = pl.DataFrame(
            {"shape": list(known), "kind": [t.kind if t else None for t in known.values()]},
            schema={"shape": pl.String, "kind": pl.String},
        )
        frame = frame.join(kinds, on="shape", how="left", maintain_order="left")
        fixed = {t: learned.fixed for t, learned in known.items() if learned and learned.fixed}
        if fixed:
            frame = frame.with_columns(kind=pl.when(_fixed_differ(frame, fixed)).then(None).otherwise(pl.col("kind")))
        with_fields = [t for t, learned in known.items() if learned and learned.fields]
        return frame["kind"], self._fields(
            frame.filter(pl.col("shape").is_in(with_fields) & pl.col("kind").is_not_null())
        )

    def _fields(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Each body's fields from its shape's recipes and its own tokens, one shape at a time."""
        parts = [pl.DataFrame(schema={"row": pl.UInt32})]
        if frame.height:
            frame = frame.with_columns(tokens=pl.col("body").str.extract_all(TOKEN))
            for (shape,), rows in frame.partition_by("shape", as_dict=True).items():
                learned = self.shapes[shape]
                assert learned is not None
                parts.append(rows.select("row", **{name: _expr(recipe) for name, recipe in learned.fields.items()}))
        return pl.concat(parts, how="diagonal")


def masked(bodies: pl.Series) -> pl.Series:
    """Each body with its tokens masked as `_MASK` masks them, in passes without a capture group (a
    capture makes polars' replace_all twice as slow): hex tokens, then digit runs, then the hex marks
    back as `0x` + MARK. That order finds the same tokens unless a digit run runs into `0x` (`10x5`,
    a token `10`, not `0x5`): those few bodies are masked by `_MASK` itself."""
    fast = bodies.str.replace_all(r"0x[0-9a-fA-F]+", _HEX_MARK).str.replace_all(r"\d+", MARK)
    fast = fast.str.replace_all(_HEX_MARK, "0x" + MARK, literal=True)
    odd = bodies.str.contains(_HEX_AFTER_DIGIT).arg_true()
    return fast.scatter(odd, bodies.gather(odd).str.replace_all(_MASK, "${1}" + MARK)) if odd.len() else fast


def _fixed_differ(frame: pl.DataFrame, fixed: dict[str, dict[int, str]]) -> pl.Expr:
    """Rows of a shape with fixed tokens whose text differs there (`P3P` where the shape learned `P2P`)."""
    rows = frame.filter(pl.col("shape").is_in(list(fixed))).with_columns(tokens=pl.col("body").str.extract_all(TOKEN))
    differ = [
        rows.filter(pl.col("shape") == shape).filter(
            ~pl.all_horizontal(pl.col("tokens").list.get(i, null_on_oob=True) == text for i, text in where.items())
        )["row"]
        for shape, where in fixed.items()
    ]
    return pl.col("row").is_in(pl.concat(differ).implode())


def _expr(recipe: Recipe | list[Recipe]) -> pl.Expr:
    """A field's text from the `tokens` column: a string, or a list of strings for a repeated field."""
    if isinstance(recipe, list):
        return pl.concat_list([_expr(r) for r in recipe]) if recipe else pl.lit([], dtype=pl.List(pl.String))
    parts = [pl.lit(p) if isinstance(p, str) else pl.col("tokens").list.get(p) for p in recipe]
    return pl.concat_str(parts) if parts else pl.lit("")
