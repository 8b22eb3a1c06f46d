"""Charts as inline SVG: declared with Altair, rendered offline by vl-convert.

The report must open with no network access, so charts are static SVG
embedded in the page rather than Vega-Lite specs that need a script.
"""

from __future__ import annotations

import altair as alt
import vl_convert as vlc
from markupsafe import Markup

alt.data_transformers.disable_max_rows()


def to_svg(chart: alt.TopLevelMixin) -> Markup:
    """Render an Altair chart to an SVG string safe to place in the page (data is XML-escaped by Vega)."""
    return Markup(vlc.vegalite_to_svg(chart.to_json()))
