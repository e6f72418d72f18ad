"""The bench's HTML page: throughput against inputs in flight, one line per batch size, and the
results table; drawn with the run report's helpers and style (:mod:`teibatch.svgdraw`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from teibatch.bench.results import error_text, latency_text
from teibatch.svgdraw import CHART_WIDTH, CSS, element, escape, nice_ceiling, plain, svg, table

if TYPE_CHECKING:
    from teibatch.bench.run import BenchReport

LINE_COLOURS = ("#0969da", "#8250df", "#1a7f37", "#bf8700", "#cf222e", "#0a7b83", "#6e7781", "#d1247a")


def render_chart(report: BenchReport) -> str:
    """A self-contained HTML page: throughput against inputs in flight per server (a log₂ axis), one
    line per batch size, the recommended setting ringed; then the results table. Inline SVG and CSS
    only: no script, no font, no request (a Content-Security-Policy forbids any)."""
    left, right, top, bottom, height = 80, 20, 34, 48, 360
    w, h = CHART_WIDTH - left - right, height - top - bottom
    xs = sorted({r.setting.inputs_in_flight for r in report.results})
    lo, hi = math.log2(xs[0]), math.log2(xs[-1])
    y_max = nice_ceiling(max(r.tokens_per_s for r in report.results))

    def at(inputs: int, tokens_per_s: float) -> tuple[float, float]:
        x = left + (w * (math.log2(inputs) - lo) / (hi - lo) if hi > lo else w / 2)
        return x, top + h - h * tokens_per_s / y_max

    parts = [element("line", class_="axis", x1=left, y1=top + h, x2=left + w, y2=top + h),
             element("line", class_="axis", x1=left, y1=top, x2=left, y2=top + h),
             element("text", "inputs in flight per server", x=left + w / 2, y=top + h + 38, text_anchor="middle"),
             element("text", "tokens/s, all servers", x=left, y=top - 8)]
    for i in range(1, 5):
        y = top + h - h * i / 4
        parts += [element("line", class_="grid", x1=left, y1=y, x2=left + w, y2=y),
                  element("text", escape(plain(y_max * i / 4)), x=left - 6, y=y + 4, text_anchor="end")]
    for inputs in xs:
        parts.append(element("text", str(inputs), x=at(inputs, 0)[0], y=top + h + 16, text_anchor="middle"))
    chosen = report.recommendation.setting if report.recommendation else None
    batches = sorted({r.setting.batch_size for r in report.results})
    for i, batch in enumerate(batches):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        line = sorted((r for r in report.results if r.setting.batch_size == batch), key=lambda r: r.setting)
        points = [at(r.setting.inputs_in_flight, r.tokens_per_s) for r in line]
        path = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts += [element("path", element("title", f"batch {batch}"), class_="mark", d=path, fill="none",
                          stroke=colour, stroke_width=2, data_batch_size=batch),
                  element("rect", x=left + 10 + i * 90, y=top + 4, width=12, height=4, fill=colour),
                  element("text", f"batch {batch}", x=left + 26 + i * 90, y=top + 10)]
        for r, (x, y) in zip(line, points, strict=True):
            tip = element("title", escape(f"{r.setting.label()}: {r.tokens_per_s:,.0f} tokens/s, "
                                          f"p95 {latency_text(r.latency_ms['p95'])}"))
            parts.append(element("circle", tip, class_="mark", cx=x, cy=y, r=4, fill=colour))
            if r.setting == chosen:
                parts.append(element("circle", element("title", "recommended"), cx=x, cy=y, r=9, fill="none",
                                     stroke="#1f2328", stroke_width=2))
    head = ["batch", "requests/server", "inputs/server", "documents/s", "tokens/s", "p50", "p95", "p99", "errors"]
    rows = [[str(r.setting.batch_size), str(r.setting.requests), str(r.setting.inputs_in_flight),
             escape(plain(round(r.documents_per_s))), escape(plain(round(r.tokens_per_s))),
             *(escape(latency_text(r.latency_ms[p])) for p in ("p50", "p95", "p99")), escape(error_text(r.errors))]
            for r in report.results]
    advice = "".join(f"<li><code>{escape(f.flag)}</code>: {escape(f.reason)}</li>"
                     for f in (report.recommendation.server_flags if report.recommendation else ()))
    summary = (f"{len(report.servers)} server(s): {escape(', '.join(url for url, _ in report.servers))}; "
               f"model {escape(report.servers[0][1].model_id)}; texts: {escape(report.text_source)}; "
               f"tokens counted by {escape(report.token_source)}.")
    notes = [f"<p>{summary}</p>"]
    if report.recommendation:
        notes.append(f"<p><strong>Recommended</strong>: {escape(report.recommendation.reason)}</p>")
    if report.stopped_early:
        notes.append(f"<p class=\"note\">Stopped early: {escape(report.stopped_early)}.</p>")
    if advice:
        notes.append(f"<p>TEI flags to try:</p><ul>{advice}</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>teibatch bench</title><style>{CSS}</style></head><body><main>"
            "<header><h1>teibatch bench</h1></header>"
            f"<section id=\"throughput\"><h2>Throughput against concurrency</h2>"
            f"{svg('throughput', height, parts)}{''.join(notes)}</section>"
            f"<section id=\"results\"><h2>Settings measured</h2>{table(head, rows)}</section>"
            "</main></body></html>\n")
