"""``teibatch report``: one self-contained HTML page per run, checked as text and in a real Chromium."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner, Result

from teibatch.cli import main
from teibatch.cli_report import report
from teibatch.htmlreport import SERIES_COLOURS, render_page, render_report, save_page
from teibatch.sink import OutputStore

HOSTILE_ID = "<script>alert(1)</script>"
CHARTS = {"progress", "throughput", "latency", "rejects", "timeline"}
BROWSER_TIMEOUT_S = 120


def invoke(*args: str) -> Result:
    """``teibatch report ARGS`` through the CLI (the command alone until cli.py registers it)."""
    if "report" in main.commands:
        return CliRunner().invoke(main, ["report", *args])
    return CliRunner().invoke(report, list(args))


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Path:
    """An output written by a real run: two local servers, 5 shards, rejects of four kinds (one hostile id)."""
    from teibatch.job import load_job
    from teibatch.pipeline import run_job

    root = tmp_path_factory.mktemp("report")
    lines = [orjson.dumps({"id": f"doc-{i:03d}", "text": f"document {i} about topic {i % 7}"}) for i in range(40)]
    lines += [orjson.dumps({"id": HOSTILE_ID, "text": "  "}), b'{"id": "missing", "body": "no text field"}',
              b'{"id": "long", "text": "' + b"word " * 400 + b'"}', b'{"id": "broken", "text": "unterminated']
    (root / "corpus").mkdir()
    (root / "corpus" / "docs.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    spec = {"name": "report-job", "corpus": {"path": str(root / "corpus"), "id_field": "id", "shard_docs": 10},
            "servers": {"provider": "local", "count": 2, "server_args": ["--max-input-length", "64"]},
            "model": {"truncate": False}, "output": {"path": str(root / "out")}}
    (root / "job.yaml").write_text(yaml.safe_dump(spec))
    run_job(load_job(str(root / "job.yaml")))
    return root / "out"


def run_report(output: Path) -> dict[str, Any]:
    [path] = (output / "runs").glob("*.json")
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def charts(page: str) -> dict[str, str]:
    """Each chart's name and SVG body."""
    return dict(re.findall(r'<svg[^>]*data-chart="([^"]+)"[^>]*>(.*?)</svg>', page, flags=re.DOTALL))


def card(page: str, label: str) -> str:
    match = re.search(rf'class="k">{label}</div><div class="v">([^<]*)<', page)
    assert match, f"no {label} card"
    return match.group(1)


def assert_shows_the_run(page: str, data: dict[str, Any]) -> None:
    docs = data["documents"]
    assert card(page, "Embedded") == f"{docs['embedded']:,}"
    assert card(page, "Rejected") == f"{docs['rejected']:,}"
    assert card(page, "Read") == f"{docs['read']:,}"
    assert card(page, "Shards committed") == f"{data['shards']['committed']} of {data['shards']['total']}"
    assert card(page, "Status") == data["status"] == "done"
    assert data["run_id"] in page
    drawn = charts(page)
    assert drawn.keys() == CHARTS
    assert all('class="mark"' in svg for svg in drawn.values()), "every chart draws its data"
    assert drawn["throughput"].count('<rect class="mark"') == len(data["servers"]) == 2
    assert drawn["rejects"].count('<rect class="mark"') == len(docs["rejected_by_reason"]) == 4
    assert drawn["progress"].count("<polyline") == 2
    assert drawn["timeline"].count('<circle class="mark"') == len(data["events"])


def assert_offline(page: str) -> None:
    """Nothing the browser would fetch: no script, link, image or frame; no external src, href or url()."""
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", page, flags=re.IGNORECASE)
    assert not re.search(r"""\b(src|href)\s*=\s*["']?\s*(https?:)?//""", page, flags=re.IGNORECASE)
    assert not re.search(r"""url\(\s*["']?\s*(https?:)?//""", page, flags=re.IGNORECASE)
    assert "@import" not in page


def test_report_writes_the_page_next_to_the_run_report(run_output: Path) -> None:
    result = invoke(str(run_output))
    assert result.exit_code == 0, result.output
    data = run_report(run_output)
    path = run_output / "runs" / f"{data['run_id']}.html"
    assert str(path) in result.output
    page = path.read_text(encoding="utf-8")
    assert_shows_the_run(page, data)
    assert_offline(page)
    assert HOSTILE_ID not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for reason in ("empty_text", "missing_text", "input_too_long", "malformed_record"):
        assert reason in page
    assert "no field &#x27;text&#x27;" in page, "a reject's detail is shown, escaped"


def test_out_writes_a_local_file_and_run_picks_the_run(run_output: Path, tmp_path: Path) -> None:
    run_id = run_report(run_output)["run_id"]
    target = tmp_path / "page.html"
    result = invoke(str(run_output), "--run", run_id, "-o", str(target))
    assert result.exit_code == 0, result.output
    assert str(target) in result.output
    assert_shows_the_run(target.read_text(encoding="utf-8"), run_report(run_output))


def test_a_resume_with_nothing_to_do_is_passed_over_and_the_choice_said(run_output: Path, tmp_path: Path) -> None:
    copy = tmp_path / "out"
    shutil.copytree(run_output, copy)
    job = run_output.parent / "job.yaml"
    again = CliRunner().invoke(main, ["run", str(job), "-q", "--set", f"output.path={copy}"])
    assert again.exit_code == 0, again.output
    assert "0 shards committed, 5 already done" in again.stdout
    first, nothing = sorted(path.stem for path in (copy / "runs").glob("*.json"))
    result = invoke(str(copy))
    assert result.exit_code == 0, result.output
    assert result.stdout == (f"report of run {first} (the latest run that committed shards or failed; the newer run "
                             f"{nothing} found nothing to do): {copy / 'runs' / first}.html\n")
    named = invoke(str(copy), "--run", nothing, "-o", str(tmp_path / "page.html"))
    assert named.stdout == f"report of run {nothing}: {tmp_path / 'page.html'}\n"


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--run", "20000101T000000Z-000000"], "no run '20000101T000000Z-000000'", id="unknown-run"),
    pytest.param([], "holds no run report", id="no-runs"),
])
def test_what_cannot_be_shown_exits_2(args: list[str], message: str, run_output: Path, tmp_path: Path) -> None:
    output = run_output if args else tmp_path / "empty"
    result = invoke(str(output), *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_an_old_report_shows_what_it_has(tmp_path: Path) -> None:
    old = {"run_id": "20240101T000000Z-abcdef", "status": "incomplete", "teibatch_version": "0.0.9",
           "documents": {"read": 10, "embedded": 7, "rejected": 0, "rejected_by_reason": {}},
           "shards": {"total": 2, "committed": 1}, "errors": ["shard x: <b>boom</b>"]}
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "runs" / f"{old['run_id']}.json").write_bytes(orjson.dumps(old))
    result = invoke(str(tmp_path / "out"), "-o", str(tmp_path / "old.html"))
    assert result.exit_code == 0, result.output
    page = (tmp_path / "old.html").read_text(encoding="utf-8")
    assert "This report has no started_at, progress, events, servers, timings" in page
    assert card(page, "Embedded") == "7"
    assert "&lt;b&gt;boom&lt;/b&gt;" in page
    assert 'id="cost"' not in page
    assert charts(page) == {}


@pytest.mark.parametrize("report_data", [
    pytest.param({}, id="empty"),
    pytest.param({"documents": None, "servers": "x", "progress": [None, {"t": "soon"}], "events": "x",
                  "timings": {"total_s": None}, "shards": [], "errors": None}, id="wrong-types"),
    pytest.param({"progress": [{"t": 1.0, "documents": 5, "status": "failed"}], "events": [{"t": 0}],
                  "servers": {"http://a": {"requests": 0, "seconds": 0}}}, id="zeros"),
])
def test_a_damaged_report_never_crashes(report_data: dict[str, Any]) -> None:
    page = render_page(report_data)
    assert page.startswith("<!DOCTYPE html>")
    assert page.rstrip().endswith("</html>")


def test_a_cost_section_only_when_the_report_has_a_cost() -> None:
    cost = {"currency": "USD", "total": 1.25, "source": "the ledger",
            "instances": [{"name": "teibatch-r-0", "gpu": "H100 <80 GB>", "price_per_hour": 2.5, "seconds": 1790.2,
                           "billed_seconds": 1800, "cost": 1.25}]}
    page = render_page({"run_id": "r", "cost": cost})
    assert 'id="cost"' in page
    assert "teibatch-r-0" in page and "$1.25" in page and "1,800 s" in page and "H100 &lt;80 GB&gt;" in page


def test_an_output_on_s3(run_output: Path, s3_endpoint: str) -> None:
    boto3, s3fs = pytest.importorskip("boto3"), pytest.importorskip("s3fs")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="outputs")
    storage = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    fs = s3fs.S3FileSystem(**storage)
    fs.put(str(run_output), "outputs/run", recursive=True)
    store = OutputStore("s3://outputs/run", storage)
    run_id, page = render_report(store)
    assert HOSTILE_ID.replace("<", "&lt;").replace(">", "&gt;") in page, "examples read from S3 parts"
    where = save_page(store, run_id, page)
    assert where == f"s3://outputs/run/runs/{run_id}.html"
    assert fs.cat(f"outputs/run/runs/{run_id}.html").decode() == page


# --- in a real browser --------------------------------------------------------------------------------


def browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if found := shutil.which(name):
            return found
    return None


def headless(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with console messages logged to stderr and no network beyond this machine."""
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
               f"--user-data-dir={profile}", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the RGB(A) rows of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks, idat = 8, {}, b""
    while offset < len(data):
        (length,), kind = struct.unpack(">I", data[offset:offset + 4]), data[offset + 4:offset + 8]
        body = data[offset + 8:offset + 8 + length]
        idat += body if kind == b"IDAT" else b""
        chunks.setdefault(kind, body)
        offset += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0, "an 8-bit RGB(A) PNG"
    step = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * step, [], bytearray(width * step)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, [bytes(b for i, b in enumerate(row) if step == 3 or i % 4 != 3) for row in rows]


@pytest.mark.skipif(browser() is None, reason="no chromium binary on PATH (apt-get install chromium; CI does)")
def test_chromium_renders_the_page(run_output: Path, tmp_path: Path) -> None:
    binary = browser()
    assert binary is not None
    page_path = tmp_path / "page.html"
    assert invoke(str(run_output), "-o", str(page_path)).exit_code == 0
    url = page_path.as_uri()

    dumped = headless(binary, tmp_path / "profile", "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    # Console messages (errors, uncaught exceptions, Content-Security-Policy refusals) are logged as CONSOLE.
    console = [line for line in dumped.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    dom = dumped.stdout
    assert_shows_the_run(dom, run_report(run_output))
    assert "<script" not in dom.lower(), "the hostile id stayed text"
    assert HOSTILE_ID.replace("<", "&lt;").replace(">", "&gt;") in dom

    shot = tmp_path / "shot.png"
    taken = headless(binary, tmp_path / "profile", "--window-size=1000,1400", f"--screenshot={shot}", url)
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    colours = {row[i:i + 3] for row in rows for i in range(0, len(row), 3)}
    assert len(colours) > 20, "the screenshot is not blank"
    assert bytes.fromhex(SERIES_COLOURS[0].lstrip("#")) in colours, "the throughput bars are drawn"


@pytest.mark.slow  # a run in its own process, which starts its own Ray beside planning and the servers
def test_the_timing_shares_add_up_to_the_whole_run(tmp_path: Path) -> None:
    (tmp_path / "docs.jsonl").write_text("".join(f'{{"id": "d{i}", "text": "doc {i}"}}\n' for i in range(20)))
    spec = {"corpus": {"path": str(tmp_path / "docs.jsonl"), "id_field": "id"},
            "output": {"path": str(tmp_path / "out")}, "servers": {"provider": "local", "count": 1}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    run = subprocess.run([sys.executable, "-m", "teibatch", "run", str(tmp_path / "job.yaml"), "-q"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr
    assert "ray_start_s" in run_report(tmp_path / "out")["timings"]
    page = render_report(OutputStore(str(tmp_path / "out")))[1]
    details = page.split('<section id="details">')[1].split("</table>")[0]
    rows = dict(re.findall(r"<tr><td>([^<]+)</td><td>[^<]*</td><td>([^<]*)</td></tr>", details))
    assert rows["total"] == "100%" and rows["ray_start"] == "–", rows  # Ray starts beside the other phases
    shares = [int(share.rstrip("%")) for phase, share in rows.items() if phase != "total" and share != "–"]
    assert 97 <= sum(shares) <= 103, rows  # each rounded to a whole percent
    # A private Ray's background CPU is one line under the timings, not a phase of its own.
    assert run_report(tmp_path / "out")["ray_background"] > 0
    assert "Ray's background:" in page.split('<section id="details">')[1] and "ray_background" not in rows


@pytest.mark.usefixtures("ray_session")
def test_a_chunked_run_has_a_chunking_section(tmp_path: Path) -> None:
    from teibatch.job import load_job
    from teibatch.pipeline import run_job

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "docs.jsonl").write_bytes(b"".join(
        orjson.dumps({"id": f"d{i}", "text": " ".join(f"word{j}" for j in range(300))}) + b"\n" for i in range(3)))
    spec = {"corpus": {"path": str(tmp_path / "corpus"), "id_field": "id"}, "output": {"path": str(tmp_path / "out")},
            "servers": {"provider": "local", "count": 1}, "chunking": {"strategy": "tokens", "max_tokens": 64}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    summary = run_job(load_job(str(tmp_path / "job.yaml")))
    chunks = run_report(tmp_path / "out")["chunking"]["chunks"]
    assert summary.status == "done" and chunks > 3
    page = render_report(OutputStore(str(tmp_path / "out")))[1]
    section = page.split('<section id="chunking">')[1].split("</section>")[0]
    assert f"<tr><td>chunks</td><td>{chunks:,}</td></tr>" in section, section
    assert "<code>builtin-hashing</code>" in section and "chunk-lengths" in charts(section)
