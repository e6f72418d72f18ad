"""Drawing helpers for teibatch's self-contained HTML pages: escaping, SVG elements, tables, one style.

The run report's page (:mod:`teibatch.htmlreport`) and the bench chart (:mod:`teibatch.bench.chart`)
draw with these, so both look alike and escape alike: every value taken from outside (ids, URLs,
messages) goes through :func:`escape` before it reaches markup; :func:`element` escapes attribute
values itself. Pages hold inline CSS (:data:`CSS`) and SVG only: no script, no font, no request.
"""

from __future__ import annotations

import html
import math

CHART_WIDTH = 760
"""Width in pixels of every chart's SVG (its ``viewBox`` too: the chart scales down with the page)."""


def escape(value: object) -> str:
    """``value`` as text safe in HTML content and in quoted attribute values (quotes escaped too)."""
    return html.escape(str(value), quote=True)


def element(tag: str, body: str = "", **attributes: object) -> str:
    """An SVG element; attribute values are escaped here, ``body`` is markup escaped by the caller.

    ``class_`` names ``class``, and underscores become hyphens (``text_anchor``: ``text-anchor``);
    floats are written with one decimal.
    """
    spec = "".join(f' {key.rstrip("_").replace("_", "-")}="{escape(_coordinate(value))}"'
                   for key, value in attributes.items())
    return f"<{tag}{spec}>{body}</{tag}>"


def _coordinate(value: object) -> object:
    return f"{value:.1f}" if isinstance(value, float) else value


def svg(name: str, height: float, parts: list[str]) -> str:
    """A chart: the ``<svg>`` of width :data:`CHART_WIDTH` holding ``parts``, named ``name`` by its
    ``data-chart`` attribute and its accessible label."""
    return element("svg", "".join(parts), class_="chart", data_chart=name, role="img", aria_label=f"{name} chart",
                   width=CHART_WIDTH, height=height, viewBox=f"0 0 {CHART_WIDTH} {height}")


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10ⁿ not below ``value``: an axis end with round ticks (1 for a
    value that is not positive and finite)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if value <= m * base * (1 + 1e-9))


def as_number(value: object) -> float | None:
    """``value`` as a float when it is a finite int or float (never a bool), else ``None``: values read
    from an old or damaged report may be missing or of any type."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def plain(value: object) -> str:
    """A value as shown to a reader, not escaped: whole numbers with thousands separators, others with
    one decimal from 10 up and three significant digits below; ``–`` for ``None``; anything else as text."""
    number = as_number(value)
    if number is None:
        return "–" if value is None else str(value)
    if number.is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    return f"{number:,.1f}" if abs(number) >= 10 else f"{number:,.3g}"


def table(head: list[str], rows: list[list[str]]) -> str:
    """A table from cells already escaped (the callers escape what came from outside); the column
    names in ``head`` are escaped here. A note instead of an empty table when there are no rows."""
    if not rows:
        return "<p class=\"note\">None recorded.</p>"
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


CSS = """
body{margin:0;background:#f6f8fa;color:#1f2328;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
main{max-width:1000px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}h3{font-size:14px;margin:0 0 6px}
header p{margin:0 0 16px;color:#57606a}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:16px;margin:0 0 16px;overflow-x:auto}
.badge{color:#fff;border-radius:12px;padding:2px 10px;font-size:14px;vertical-align:middle}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:10px}
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}
.k{color:#57606a;font-size:12px}.v{font-size:20px;font-weight:600}.n{color:#57606a;font-size:12px}
.note{color:#57606a;font-style:italic}.bad{color:#cf222e;font-weight:600}
table{border-collapse:collapse;margin-top:8px;width:100%}
th,td{border-bottom:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td ul{margin:0;padding-left:16px}code{font-size:12px;word-break:break-all}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:16px}
svg.chart{display:block;max-width:100%;height:auto;font-size:11px}svg text{fill:#1f2328}
.axis{stroke:#57606a}.grid{stroke:#d0d7de}.errors li{color:#cf222e}
footer{color:#57606a;font-size:12px;text-align:center}
"""
"""The one style sheet of every page, inlined in its ``<style>``."""
