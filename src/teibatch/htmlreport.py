"""One self-contained HTML page per run report, for ``teibatch report``.

The page is a single file: inline CSS and SVG charts drawn here, no script, no font, no request of
any kind, so it opens offline and can be attached to a ticket. A Content-Security-Policy tag forbids
everything else as a second line of defence; the first is that every value taken from the report or
the rejects parts (ids, details, server URLs, messages) goes through :func:`teibatch.svgdraw.escape`.

Reports written by older versions lack some keys (``started_at``, ``progress``, ``events``): their
sections say what is missing instead of failing, and no key is ever assumed present.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from teibatch.errors import JobSpecError, SinkError
from teibatch.pipeline.chunks import HISTOGRAM_LABELS
from teibatch.pipeline.progress import WARNING_EVENTS
from teibatch.sink import REJECTS_DIR, RUNS_DIR, Manifest, OutputStore, choose_run, run_ids
from teibatch.svgdraw import CHART_WIDTH, CSS, as_number, element, escape, nice_ceiling, plain, svg, table

DEFAULT_EXAMPLES_PER_REASON = 3
DEFAULT_MAX_REJECT_PARTS = 200
"""Rejects parts read for examples at most: bounds the time spent on an output of many shards."""
MAX_LINE_POINTS = 800
MAX_EVENT_ROWS = 500
DETAIL_CHARS = 300
BAD_STATUSES = frozenset({"failed", "not_committed"})
STATUS_COLOURS = {"done": "#1a7f37", "incomplete": "#9a6700", "interrupted": "#9a6700", "failed": "#cf222e"}
SERIES_COLOURS = ("#0969da", "#8250df")
TROUBLE_COLOUR = "#cf222e"
TIMING_PHASES = ("plan_s", "ray_start_s", "ray_wait_s", "warm_up_s", "fleet_up_s", "embed_s", "total_s")
TIMING_SEQUENCE = ("plan_s", "ray_wait_s", "fleet_up_s", "warm_up_s", "embed_s")
"""The phases that follow one another, each a share of ``total_s``; the rest (``ray_start_s``: Ray
starts in the background, and the run waits only ``ray_wait_s`` of it) overlaps them and has no share."""


def render_report(store: OutputStore, run_id: str | None = None) -> tuple[str, str]:
    """The run id and the HTML page of run ``run_id`` in ``store`` (without one, the latest run that did work).

    Raises :class:`JobSpecError` when the output holds no run report or none named ``run_id``.
    """
    run_id, report = load_run_report(store, run_id)
    reasons = list(_d(_d(report.get("documents")).get("rejected_by_reason")))
    examples, unread = reject_examples(store, run_id, reasons)
    return run_id, render_page(report, examples, output=store.url, unread_parts=unread)


def save_page(store: OutputStore, run_id: str, page: str) -> str:
    """Write ``page`` next to the run's JSON report (``runs/<run id>.html``); return where it went."""
    relative = f"{RUNS_DIR}/{run_id}.html"
    blob = page.encode("utf-8")
    store.write_atomic(relative, lambda handle: handle.write(blob))
    return f"{store.url.rstrip('/')}/{relative}"


def load_run_report(store: OutputStore, run_id: str | None) -> tuple[str, dict[str, Any]]:
    """The id and JSON of run ``run_id``, or of the run :func:`~teibatch.sink.choose_run` picks;
    :class:`JobSpecError` when there is none."""
    runs = run_ids(store)
    chosen = choose_run(store) if run_id is None and runs else None
    if chosen is not None:
        run_id = chosen.run_id
    elif not runs:
        raise JobSpecError(f"{store.url} holds no run report ({RUNS_DIR}/*.json): check the path, or run "
                           "`teibatch run` on a job writing there first")
    elif run_id not in runs:
        recent = ", ".join(runs[-5:])
        raise JobSpecError(f"no run {run_id!r} in {store.url}/{RUNS_DIR}; the latest runs there: {recent}",
                           key="--run")
    report = store.read_json(f"{RUNS_DIR}/{run_id}.json")
    if not isinstance(report, dict):
        raise SinkError(f"{store.url}/{RUNS_DIR}/{run_id}.json is not a run report (a JSON object expected)")
    return run_id, report


def reject_examples(store: OutputStore, run_id: str, reasons: list[str],
                    per_reason: int = DEFAULT_EXAMPLES_PER_REASON,
                    max_parts: int = DEFAULT_MAX_REJECT_PARTS) -> tuple[dict[str, list[tuple[str, str]]], int]:
    """Up to ``per_reason`` (id, detail) examples for each reason, and how many parts could not be read.

    Parts of the shards this run committed are read first (the manifest says which); then the other
    parts, since a later run may have rewritten this run's shards. Reading stops once every reason has
    its examples or ``max_parts`` parts were read.
    """
    examples: dict[str, list[tuple[str, str]]] = {reason: [] for reason in reasons}
    if not reasons:
        return examples, 0
    unread = 0
    for relative in _rejects_parts(store, run_id)[:max_parts]:
        if all(len(found) >= per_reason for found in examples.values()):
            break
        try:
            with store.fs.open(store.path(relative), "rb") as handle:
                rows = pq.read_table(handle, columns=["id", "reason", "detail"]).to_pylist()
        except (OSError, pa.ArrowException, KeyError):
            unread += 1  # a part removed by a later run, or damaged: examples are a courtesy
            continue
        for row in rows:
            found = examples.get(str(row.get("reason")))
            if found is not None and len(found) < per_reason:
                found.append((str(row.get("id")), str(row.get("detail") or "")))
    return examples, unread


def _rejects_parts(store: OutputStore, run_id: str) -> list[str]:
    names = [name for name in store.list(REJECTS_DIR) if name.startswith("part-") and name.endswith(".parquet")]
    try:
        manifest = Manifest.load(store)
    except SinkError:
        manifest = None  # a damaged manifest only loses the ordering
    mine = {f"part-{sid}.parquet" for sid, entry in (manifest.shards.items() if manifest else ())
            if entry.run_id == run_id and entry.rejects}
    ordered = sorted(names, key=lambda name: name not in mine)
    return [f"{REJECTS_DIR}/{name}" for name in ordered]


# --- the page ---------------------------------------------------------------------------------------


def render_page(report: dict[str, Any], examples: dict[str, list[tuple[str, str]]] | None = None, *,
                output: str = "", unread_parts: int = 0) -> str:
    """The HTML page of ``report`` (a run report's JSON); ``examples`` as :func:`reject_examples` gives."""
    run_id = str(report.get("run_id", "unknown run"))
    sections = [_headline(report, output), _missing(report), _progress(report), _servers(report),
                _latency(report), _chunking(report), _rejects(report, examples or {}, unread_parts),
                _timeline(report), _errors(report), _replacements(report), _cost(report), _details(report)]
    version = report.get("teibatch_version", "an unknown version")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            f"style-src 'unsafe-inline'; img-src data:\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>teibatch run {escape(run_id)}</title><style>{CSS}</style></head><body><main>"
            + "".join(part for part in sections if part)
            + f"<footer>Run report of teibatch {escape(version)} ({RUNS_DIR}/{escape(run_id)}.json), "
              "drawn by <code>teibatch report</code>.</footer></main></body></html>\n")


def _headline(report: dict[str, Any], output: str) -> str:
    status = str(report.get("status", "unknown"))
    docs, shards, timings = _d(report.get("documents")), _d(report.get("shards")), _d(report.get("timings"))
    progress = _l(report.get("progress"))
    duration = as_number(timings.get("total_s"))
    if duration is None and progress:
        duration = as_number(_d(progress[-1]).get("t"))
    shard_text = f"{_fmt(shards.get('committed'))} of {_fmt(shards.get('total'))}"
    shard_note = f"{_fmt(shards.get('skipped_committed'))} already done, {_fmt(shards.get('failed'))} failed"
    truncated = as_number(docs.get("truncated"))
    embedded_note = "documents" + (f", {_fmt(truncated)} truncated" if truncated else "")
    cards = [("Status", escape(status), ""), ("Embedded", _fmt(docs.get("embedded")), embedded_note),
             ("Rejected", _fmt(docs.get("rejected")), "documents"),
             ("Skipped unchanged", _fmt(docs.get("skipped_unchanged")), "documents"),
             ("Read", _fmt(docs.get("read")), "documents"),
             ("Waiting for servers", _fmt(docs.get("waiting_for_servers")), "documents"),
             ("Shards committed", shard_text, shard_note), ("Duration", escape(_duration(duration)), ""),
             ("Throughput", _fmt(report.get("throughput_docs_per_s")), "documents/s while embedding")]
    colour = STATUS_COLOURS.get(status, "#57606a")
    head = (f"<header><h1>teibatch run <code>{escape(report.get('run_id', '?'))}</code> "
            f"<span class=\"badge\" style=\"background:{colour}\">{escape(status)}</span></h1>"
            f"<p>output <code>{escape(output or '?')}</code>"
            f" · started {escape(report.get('started_at', 'at an unknown time'))}"
            f" · teibatch {escape(report.get('teibatch_version', '?'))}</p></header>")
    grid = "".join(f"<div class=\"card\"><div class=\"k\">{k}</div><div class=\"v\">{v}</div>"
                   f"<div class=\"n\">{escape(n)}</div></div>" for k, v, n in cards)
    return f"{head}<section id=\"summary\"><div class=\"cards\">{grid}</div></section>"


def _missing(report: dict[str, Any]) -> str:
    absent = [key for key in ("started_at", "progress", "events", "servers", "timings") if key not in report]
    if not absent:
        return ""
    return (f"<p class=\"note\">This report has no {escape(', '.join(absent))}: it was written by teibatch "
            f"{escape(report.get('teibatch_version', '(unknown version)'))}, before these were recorded. "
            "The sections below show what it has.</p>")


def _progress(report: dict[str, Any]) -> str:
    title = "<section id=\"progress\"><h2>Documents over time</h2>"
    points = [_d(p) for p in _l(report.get("progress"))]
    points = [p for p in points
              if as_number(p.get("t")) is not None and as_number(p.get("documents")) is not None]
    if not points:
        why = "has no progress points" if "progress" not in report else "recorded no finished shard"
        return f"{title}<p class=\"note\">This run {why}.</p></section>"
    series = [("documents with their vectors (finished shards, and landed in running ones)",
               [(as_number(p["t"]) or 0.0, as_number(p["documents"]) or 0.0) for p in points])]
    if any("rows" in p for p in points):
        totals = itertools.accumulate(as_number(p.get("rows")) or 0.0 for p in points)
        series.append(("vectors written", [(as_number(p["t"]) or 0.0, total)
                                           for p, total in zip(points, totals, strict=True)]))
    bad = [(as_number(p["t"]) or 0.0, as_number(p["documents"]) or 0.0,
            f"shard {p.get('shard', '?')}: {p.get('status')}")
           for p in points if p.get("status") in BAD_STATUSES]
    note = (f"<p>{len(bad)} shard(s) not committed, marked in red.</p>" if bad else "")
    end = as_number(_d(report.get("timings")).get("total_s")) or 0.0
    chart = line_chart("progress", series, bad, "seconds since the run began", x_end=end)
    return f"{title}{chart}{note}</section>"


def _servers(report: dict[str, Any]) -> str:
    title = "<section id=\"servers\"><h2>Throughput per server</h2>"
    servers = _server_stats(report)
    if not servers:
        return f"{title}<p class=\"note\">No server statistics in this report.</p></section>"
    bars, rows = [], []
    for url, s in servers.items():
        rate = _ratio(s.get("inputs"), s.get("seconds"))
        bars.append((url, rate or 0.0, f"{plain(rate)} inputs/s"))
        rows.append([escape(url), _fmt(s.get("requests")), _fmt(s.get("inputs")), _fmt(rate),
                     _fmt(s.get("mean_inputs_per_request")), _fmt(s.get("max_in_flight")),
                     _fmt(s.get("mean_in_flight")), _percent(s.get("busy_share")), _fmt(s.get("window")),
                     _fmt(s.get("window_decreases"))])
    head = ["server", "requests", "inputs", "inputs/s", "mean inputs/request", "max in flight",
            "mean in flight", "busy share", "window", "window decreases"]
    return (f"{title}<p>Inputs per second of request time (inputs ÷ the sum of request seconds).</p>"
            f"{bar_chart('throughput', bars)}{table(head, rows)}</section>")


def _latency(report: dict[str, Any]) -> str:
    servers = _server_stats(report)
    if not servers:
        return ""
    bars, rows = [], []
    for url, s in servers.items():
        mean = _ratio(s.get("seconds"), s.get("requests"))
        ms = None if mean is None else mean * 1000
        errors = ", ".join(f"{kind}: {plain(n)}" for kind, n in _d(s.get("errors")).items()) or "none"
        bars.append((url, ms or 0.0, f"{plain(ms)} ms"))
        rows.append([escape(url), _fmt(s.get("requests")), escape(f"{plain(ms)} ms"), _fmt(s.get("retries")),
                     escape(errors), _fmt(s.get("marked_down"))])
    head = ["server", "requests", "mean latency", "retries", "errors", "marked down"]
    return ("<section id=\"latency\"><h2>Latency and retries per server</h2>"
            "<p>Mean request latency: the sum of request seconds ÷ requests.</p>"
            f"{bar_chart('latency', bars)}{table(head, rows)}</section>")


def _server_stats(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(url): _d(stats) for url, stats in _d(report.get("servers")).items()}


def _chunking(report: dict[str, Any]) -> str:
    """A chunked run's documents, chunks, tokens and token rule, and its chunks by length; nothing otherwise."""
    chunking = _d(report.get("chunking"))
    if not chunking:
        return ""
    rows = [[escape(label), _fmt(chunking.get(key))] for label, key in (
        ("documents chunked", "documents"), ("of them unchanged, kept", "documents_reused"),
        ("chunks", "chunks"), ("chunks kept from earlier runs", "chunks_reused"),
        ("chunks sent once for another document", "chunks_deduplicated"),
        ("tokens embedded", "tokens_embedded"), ("tokens in the documents", "document_tokens"))]
    histogram = _d(chunking.get("histogram"))
    bars = [(label, count, plain(count)) for label in HISTOGRAM_LABELS
            if (count := as_number(histogram.get(label))) is not None]
    rule = f"<p>Tokens counted with <code>{escape(chunking.get('tokenizer') or 'an unknown rule')}</code>.</p>"
    chart = f"<h3>Chunks by length (tokens)</h3>{bar_chart('chunk-lengths', bars)}" if bars else ""
    return f"<section id=\"chunking\"><h2>Chunking</h2>{rule}{table(['', 'count'], rows)}{chart}</section>"


def _rejects(report: dict[str, Any], examples: dict[str, list[tuple[str, str]]], unread: int) -> str:
    title = "<section id=\"rejects\"><h2>Rejects by reason</h2>"
    reasons = {str(k): as_number(v) or 0.0
               for k, v in _d(_d(report.get("documents")).get("rejected_by_reason")).items()}
    if not reasons:
        return f"{title}<p class=\"note\">No document was rejected.</p></section>"
    bars = [(reason, count, plain(count)) for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])]
    rows = []
    for reason, count, _ in bars:
        found = examples.get(reason, [])
        listed = "".join(f"<li><code>{escape(doc_id)}</code> {escape(_clip(detail, DETAIL_CHARS))}</li>"
                         for doc_id, detail in found)
        rows.append([escape(reason), _fmt(count), f"<ul>{listed}</ul>" if listed else "<em>none found</em>"])
    note = (f"<p class=\"note\">{unread} rejects part(s) could not be read.</p>" if unread else "")
    return (f"{title}{bar_chart('rejects', bars, colour=TROUBLE_COLOUR)}"
            f"<p>Examples come from the output's <code>{REJECTS_DIR}/</code> parts (id, detail).</p>"
            f"{table(['reason', 'documents', 'examples'], rows)}{note}</section>")


def _timeline(report: dict[str, Any]) -> str:
    title = "<section id=\"timeline\"><h2>Timeline</h2>"
    if "events" not in report:
        return f"{title}<p class=\"note\">This report has no events.</p></section>"
    events = [e for e in map(_d, _l(report.get("events"))) if as_number(e.get("t")) is not None]
    if not events:
        return f"{title}<p class=\"note\">No event was recorded.</p></section>"
    end = max([as_number(_d(report.get("timings")).get("total_s")) or 0.0]
              + [as_number(e["t"]) or 0.0 for e in events])
    rows = []
    for e in events[:MAX_EVENT_ROWS]:
        extra = _clip("; ".join(f"{k}={v}" for k, v in e.items() if k not in {"t", "event", "message"}),
                      DETAIL_CHARS)
        css = " class=\"bad\"" if e.get("event") in WARNING_EVENTS else ""
        rows.append([escape(plain(e["t"]) + " s"), f"<span{css}>{escape(e.get('event', '?'))}</span>",
                     escape(e.get("message", "")), escape(extra)])
    more = (f"<p>… and {len(events) - MAX_EVENT_ROWS} more events.</p>" if len(events) > MAX_EVENT_ROWS else "")
    return (f"{title}{timeline_chart(events, end)}"
            f"{table(['t', 'event', 'message', 'fields'], rows)}{more}</section>")


def _errors(report: dict[str, Any]) -> str:
    errors = _l(report.get("errors"))
    items = "".join(f"<li>{escape(error)}</li>" for error in errors)
    body = f"<ul class=\"errors\">{items}</ul>" if errors else "<p>No errors.</p>"
    return f"<section id=\"errors\"><h2>Errors</h2>{body}</section>"


def _cost(report: dict[str, Any]) -> str:
    if "cost" not in report:
        return ""  # only reports of runs that rent servers carry a cost
    cost = _d(report["cost"])
    rows = [[escape(i.get("name")), escape(i.get("gpu") or "–"), f"${_fmt(i.get('price_per_hour'))}/h",
             f"{_fmt(i.get('seconds'))} s", f"{_fmt(i.get('billed_seconds'))} s", f"${_fmt(i.get('cost'))}",
             "<span class=\"bad\">taken back by the cloud</span>" if i.get("lost") else "given back"]
            for i in map(_d, _l(cost.get("instances")))]
    total = f"<p><strong>Total: ${_fmt(cost.get('total'))} {escape(cost.get('currency', ''))}</strong></p>"
    source = f"<p class=\"note\">{escape(cost['source'])}</p>" if cost.get("source") else ""
    listing = table(["instance", "GPU", "price", "rented", "billed", "cost", "ended"], rows)
    return f"<section id=\"cost\"><h2>Cost</h2>{total}{listing}{source}</section>"


def _replacements(report: dict[str, Any]) -> str:
    """Servers the cloud took back mid-run, and what replaced them."""
    lost = list(map(_d, _l(report.get("replacements"))))
    if not lost:
        return ""
    rows = [[escape(e.get("instance")), escape(e.get("reason")), escape(e.get("status")),
             escape(e.get("replacement_url") or e.get("why") or "–"),
             f"{_fmt(e['seconds_to_replace'])} s" if e.get("seconds_to_replace") is not None else "–"]
            for e in lost]
    replaced = sum(1 for e in lost if e.get("status") == "replaced")
    return (f"<section id=\"replacements\"><h2>Servers taken back</h2><p>{len(lost)} server(s) taken back by the "
            f"cloud mid-run, {replaced} replaced; their requests went to the other servers.</p>"
            f"{table(['instance', 'why', 'status', 'replacement', 'after'], rows)}</section>")


def _details(report: dict[str, Any]) -> str:
    timings = {str(k): as_number(v) for k, v in _d(report.get("timings")).items()}
    total = timings.get("total_s")
    order = {phase: i for i, phase in enumerate(TIMING_PHASES)}  # the order the run goes through them
    # Only phases that follow one another take a share, so that the shares add up to the whole run.
    shares = {k: v / total for k, v in timings.items() if k in TIMING_SEQUENCE and total and v is not None}
    rest = 1 - sum(shares.values()) if shares else None
    rows = [[escape(k.removesuffix("_s")), escape(_duration(v)),
             _percent(shares.get(k)) if k != "total_s" else _percent(1.0 if total else None)]
            for k, v in sorted(timings.items(), key=lambda kv: order.get(kv[0], len(order)))]
    if rest is not None and total:
        rows.insert(-1 if "total_s" in timings else len(rows),
                    ["other (teardown, commit, report)", escape(_duration(max(rest, 0.0) * total)),
                     _percent(max(rest, 0.0))])
    memory = [[escape(k), _fmt(v)] for k, v in _d(report.get("memory")).items()]
    nodes = [[f"<code>{escape(k)}</code>", _fmt(v)] for k, v in _d(report.get("shards_per_node")).items()]
    parts = [("Timings", table(["phase", "time", "of total"], rows)
              + "<p class=\"note\">ray_start runs in the background, beside plan and fleet_up; "
                "ray_wait is the part of it the run waited for.</p>" + _ray_background(report)),
             ("Memory (MB)", table(["process", "peak RSS"], memory)),
             ("Shards per node", table(["node", "shards"], nodes))]
    body = "".join(f"<div><h3>{name}</h3>{shown}</div>" for name, shown in parts)
    return f"<section id=\"details\"><h2>Details</h2><div class=\"cols\">{body}</div></section>"


def _ray_background(report: dict[str, Any]) -> str:
    """One line: the CPU Ray's own processes burned (``ray_background``), where the report knows it."""
    cpu = as_number(report.get("ray_background"))
    if cpu is None:
        return ""
    return (f"<p class=\"note\" id=\"ray-background\">Ray's background: {escape(_duration(cpu))} of CPU in Ray's "
            "own processes (GCS, raylet, agents, idle workers) over the run.</p>")


# --- charts: inline SVG -----------------------------------------------------------------------------


def bar_chart(name: str, bars: list[tuple[str, float, str]], *, colour: str = SERIES_COLOURS[0]) -> str:
    """Horizontal bars, ``(label, value, value as shown)`` each; the longest fills the chart's width."""
    label_w, row_h = 300, 28
    room = CHART_WIDTH - label_w - 110
    top = max((max(0.0, value) for _, value, _ in bars), default=0.0) or 1.0
    parts = []
    for i, (label, value, shown) in enumerate(bars):
        y, width = 6 + i * row_h, room * max(0.0, value) / top
        tip = element("title", escape(f"{label}: {shown}"))
        parts += [element("text", escape(_clip(label, 44)) + tip, x=label_w - 8, y=y + 17, text_anchor="end"),
                  element("rect", tip, class_="mark", x=label_w, y=y + 4, width=max(width, 1.0),
                          height=row_h - 8, fill=colour),
                  element("text", escape(shown), x=label_w + width + 6, y=y + 17)]
    return svg(name, 12 + len(bars) * row_h, parts)


def line_chart(name: str, series: list[tuple[str, list[tuple[float, float]]]],
               marks: list[tuple[float, float, str]], x_label: str, x_end: float = 0.0) -> str:
    """Counts that grow in steps (``(legend, [(x, y)])`` each, from the origin to ``x_end``), and red
    marks with a tooltip (``(x, y, text)``)."""
    left, right, top, bottom, height = 70, 20, 28, 44, 320
    w, h = CHART_WIDTH - left - right, height - top - bottom
    x_max = nice_ceiling(max([x_end, *(x for _, points in series for x, _ in points)]))
    y_max = nice_ceiling(max([0.0, *(y for _, points in series for _, y in points)]))

    def at(x: float, y: float) -> tuple[float, float]:
        return left + w * x / x_max, top + h - h * y / y_max

    parts = [_axes(left, top, w, h, x_max, y_max, x_label)]
    for i, (legend, points) in enumerate(series):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        steps, last = [(0.0, 0.0)], 0.0
        for x, y in _thin(points):
            steps += [(x, last), (x, y)]
            last = y
        steps.append((max(x_end, steps[-1][0]), last))
        coords = " ".join("{:.1f},{:.1f}".format(*at(x, y)) for x, y in steps)
        parts += [element("polyline", element("title", escape(legend)), class_="mark", fill="none",
                          stroke=colour, stroke_width=2, points=coords),
                  element("rect", x=left + 10 + i * 240, y=8, width=12, height=4, fill=colour),
                  element("text", escape(legend), x=left + 28 + i * 240, y=14)]
    for x, y, tip in marks[:MAX_LINE_POINTS]:
        cx, cy = at(x, y)
        parts.append(element("circle", element("title", escape(tip)), class_="mark", cx=cx, cy=cy, r=4,
                             fill=TROUBLE_COLOUR))
    return svg(name, height, parts)


def timeline_chart(events: list[dict[str, Any]], end: float) -> str:
    """One lane per event name, a dot per event at its time (red for the events that warn)."""
    events = events[:MAX_LINE_POINTS]
    lanes = {name: i for i, name in enumerate(dict.fromkeys(str(e.get("event", "?")) for e in events))}
    left, lane_h, top = 170, 24, 8
    w, x_max, axis_y = CHART_WIDTH - left - 20, nice_ceiling(end), top + len(lanes) * lane_h + 4
    parts = []
    for name, lane in lanes.items():
        y = top + lane * lane_h + lane_h / 2
        parts += [element("text", escape(_clip(name, 24)), x=left - 8, y=y + 4, text_anchor="end"),
                  element("line", class_="grid", x1=left, y1=y, x2=left + w, y2=y)]
    for i in range(5):
        x = left + w * i / 4
        parts += [element("line", class_="grid", x1=x, y1=top, x2=x, y2=axis_y),
                  element("text", escape(f"{plain(x_max * i / 4)} s"), x=x, y=axis_y + 14, text_anchor="middle")]
    for e in events:
        name, t = str(e.get("event", "?")), as_number(e.get("t")) or 0.0
        colour = TROUBLE_COLOUR if name in WARNING_EVENTS else SERIES_COLOURS[0]
        tip = element("title", escape(f"{plain(t)} s: {e.get('message', name)}"))
        parts.append(element("circle", tip, class_="mark", cx=left + w * t / x_max,
                             cy=top + lanes[name] * lane_h + lane_h / 2, r=5, fill=colour))
    return svg("timeline", axis_y + 24, parts)


def _axes(left: int, top: int, w: int, h: int, x_max: float, y_max: float, x_label: str) -> str:
    parts = [element("line", class_="axis", x1=left, y1=top + h, x2=left + w, y2=top + h),
             element("line", class_="axis", x1=left, y1=top, x2=left, y2=top + h),
             element("text", escape(x_label), x=left + w / 2, y=top + h + 36, text_anchor="middle")]
    for i in range(5):
        x, y = left + w * i / 4, top + h - h * i / 4
        parts.append(element("text", escape(plain(x_max * i / 4)), x=x, y=top + h + 16, text_anchor="middle"))
        if i:
            parts += [element("line", class_="grid", x1=left, y1=y, x2=left + w, y2=y),
                      element("text", escape(plain(y_max * i / 4)), x=left - 6, y=y + 4, text_anchor="end")]
    return "".join(parts)


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    # A run of a million shards must not make a page of megabytes: keep every k-th point and the last.
    if len(points) <= MAX_LINE_POINTS:
        return points
    step = math.ceil(len(points) / MAX_LINE_POINTS)
    return [*points[::step], points[-1]]


# --- values: anything may be missing or of the wrong type in an old or damaged report ---------------


def _d(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _ratio(numerator: object, denominator: object) -> float | None:
    top, bottom = as_number(numerator), as_number(denominator)
    return top / bottom if top is not None and bottom else None


def _fmt(value: object) -> str:
    return escape(plain(value))


def _percent(value: object) -> str:
    number = as_number(value)
    return "–" if number is None else f"{number * 100:.0f}%"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
