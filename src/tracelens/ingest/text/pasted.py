"""Logs pasted from issue trackers, chat and web consoles, put back as the tool printed them.

A log copied out of a Markdown quote has `> ` before every line; Markdown renderers turn file
names and addresses into links (`transport/[net_ib.cc:1909](http://net_ib.cc:1909/)`) and
escape `_` and `*`; HTML views escape `<` as `&lt;`. Only lines that carry one of these marks
are rewritten (vectorized), so a plain log costs one cheap scan. Chat clients' leading
timestamps and names need nothing here: the parsers find their records anywhere in a line.
"""

from __future__ import annotations

import polars as pl

_QUOTE = r"^\s*(?:>\s?)+"
_LINK = r"\[([^\]\n]*)\]\((?:https?|mailto|ftp):[^)\s]*\)"
_AUTOLINK = r"<((?:https?|mailto):[^>\s]*)>"
_ESCAPED = r"\\([_*\[\]<>`#|~\\])"
# entities HTML views use for log text; &amp; last, so `&amp;lt;` becomes `&lt;` as it was written
_ENTITIES = {
    "&lt;": "<",
    "&gt;": ">",
    "&quot;": '"',
    "&#39;": "'",
    "&#x27;": "'",
    "&#34;": '"',
    "&nbsp;": " ",
    "&amp;": "&",
}
_MARKS = r"\]\(|&|\\"  # a link, an entity, an escape: literals the regex engine searches at once


def unpaste(text: pl.Series) -> pl.Series:
    """`text` with quote marks, Markdown links and escapes, and HTML entities undone where present."""
    marked = text.str.contains(_QUOTE) | text.str.contains(_MARKS)
    if not marked.any():
        return text
    rows = marked.arg_true()
    fixed = (
        text.gather(rows)
        .str.replace(_QUOTE, "")
        .str.replace_all(_LINK, "$1")
        .str.replace_all(_AUTOLINK, "$1")
        .str.replace_all(_ESCAPED, "$1")
        .str.replace_many(list(_ENTITIES), list(_ENTITIES.values()))
    )
    return text.scatter(rows, fixed)
