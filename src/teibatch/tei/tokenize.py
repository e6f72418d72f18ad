"""The servers' own ``POST /tokenize`` as a token counter, for chunking where no tokenizer.json is at hand.

TEI tokenizes with the served model's tokenizer, so its ``/tokenize`` counts exactly as its
``max_input_length`` does. It answers, per input, every token with ``special`` and ``start``/``stop``:
*byte* offsets into the input's UTF-8 (``null`` for special tokens). :class:`RouteTokenCounter`
turns that into what the chunker needs (the ``TokenCounter`` protocol of
:mod:`teibatch.corpus.token_count`):

* ``offsets``: per text, the character offsets into the Python ``str`` of its tokens, special tokens
  left out (asked with ``add_special_tokens: false``). A token that starts or ends inside a
  character (byte-level BPE cuts an emoji into several tokens) covers that whole character, as the
  ``tokenizers`` bindings give it;
* ``counts``: per text, every token the server counts, special tokens included (and, with
  ``prompt_name``, the prompt's tokens: the server adds them to every input it embeds);
* ``special_tokens``: what the server adds to every input, asked once (two small requests);
* ``cuts``: ``none`` (every chunk is counted again as sent), unless the caller knows the server's
  tokenizer makes a stronger promise (see :mod:`teibatch.token_cuts`). TEI's ``/info`` says
  nothing about its tokenizer.

Requests stay within the servers' limits: at most ``max_batch_size`` inputs each, bodies within the
payload limit, at most ``max_requests`` in flight for all calls together (and never more inputs in
flight than ``max_inflight_inputs``), spread over the servers in turn. Answers are handled as the
embedder handles them (:mod:`teibatch.tei.embedder`), with the same typed errors of
:mod:`teibatch.tei.client`:

================================ ===============================================================
answer                           what happens
================================ ===============================================================
429 overloaded                   the same texts resent after ``Retry-After`` or a jittered wait;
                                 more than ``MAX_OVERLOAD_RETRIES`` in a row: raised
5xx, no answer, a wrong 200      resent to the next server after a jittered wait; more than
                                 ``max_retries`` in a row: raised
413 body too large, 422 too many the lower limit is learned and the texts are sent in smaller
                                 requests; a single text too big for a body is sent in pieces
401, any other 4xx               raised: every other request would fail the same way
================================ ===============================================================

Empty texts are answered without asking: no tokens, and ``special_tokens`` counted.

**Long texts go in pieces.** TEI's ``/tokenize`` never truncates, so it refuses (422) any input over
``max_input_length * 250`` characters (``max_chars``, from the servers' ``/info``), and a body over
the payload limit is refused too. A text over either is cut into pieces under both
(:func:`piece_bounds`), and the pieces are sent like any other texts: packed several to a request
beside the other texts of the call. Each piece is tokenized alone; its spans are moved by the
piece's start, and a text's count is its pieces' counts less what the server adds to every input
(``special_tokens``) for each piece after the first. What holds:

* a piece ends where a run of whitespace starts, so the next piece starts with that whitespace. A
  tokenizer whose tokens never cross whitespace (WordPiece, the built-in rule) or that joins
  whitespace to the word after it (byte-level BPE, SentencePiece's ``▁``) gives the pieces the
  whole text's tokens, and the count adds up exactly;
* only where a window of ``max_chars`` characters holds no whitespace start (a run of spaces, a
  base64 blob, text without spaces) is a piece cut elsewhere: inside the whitespace, else inside a
  word, where the tokens next to the cut may differ from the whole text's;
* the chunker counts each chunk again as sent (``cuts: none``), far below the limit, so such a cut
  can move where a chunk ends, never let a chunk over ``max_tokens``.

A text that the servers still refuse (a 4xx naming the input: :data:`TEXT_REFUSALS`) fails the call;
the caller may ask again text by text to learn which (a shard rejects that document, with the
server's message, as ``tokenize_failed``).

The counter is called from plain threads (a shard task's, which run no event loop), and from
several at once: it runs its own event loop in one background thread, started on first use and
shared by every caller, with one connection pool. Close it (``close()``, or use it as a context
manager) when done.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import httpx
import numpy as np
import orjson

from teibatch.endpoint import Endpoint
from teibatch.errors import (
    InputTooLong,
    PayloadTooLarge,
    ServerFault,
    TeiOverloaded,
    TeiRequestError,
    TeiUnavailable,
    TooManyInputs,
)
from teibatch.tei.checks import FAULT_BAD_BODY
from teibatch.tei.client import DEFAULT_TIMEOUT_S, TeiClient
from teibatch.tei.embedder import DEFAULT_MAX_RETRIES, MAX_OVERLOAD_RETRIES, MAX_RETRY_AFTER_S, backoff
from teibatch.tei.info import ClientLimits
from teibatch.token_cuts import CUTS, CUTS_NONE

DEFAULT_MAX_REQUESTS = 4
"""``/tokenize`` requests in flight at most, for all of one counter's callers together: tokenizing
is cheap for a server, and the route shares its CPU with the embedding the run is there for."""
PROBE_TEXT = "a"
"""The text whose count, less its own tokens, is what the server adds to every input."""

TEXT_REFUSALS = (InputTooLong, PayloadTooLarge, TeiRequestError)
"""Answers that refuse a text rather than the request's form or the server's state (too many
characters or tokens, too big for any body, another 4xx such as a tokenizer error): asked text by
text, only the texts at fault fail."""

_T = TypeVar("_T")
Spans = list[tuple[int, int]]
_RUN_START = re.compile(r"(?<=\S)\s")
_SPACE = re.compile(r"\s")


@dataclass(frozen=True)
class TokenizeStats:
    """What a :class:`RouteTokenCounter` sent: ``requests`` and ``inputs`` (retries and resent texts
    included, so they match the servers' own counts) and ``retries`` (requests sent again)."""

    requests: int = 0
    inputs: int = 0
    retries: int = 0

    def __add__(self, other: TokenizeStats) -> TokenizeStats:
        return TokenizeStats(self.requests + other.requests, self.inputs + other.inputs,
                             self.retries + other.retries)

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class _Ask:
    """One kind of question to ``/tokenize``: with or without special tokens, with a prompt or not."""

    special: bool
    prompt_name: str | None

    def body(self, encoded: Sequence[bytes]) -> bytes:
        """The request body for texts already encoded as JSON strings."""
        head = orjson.dumps({"add_special_tokens": self.special, "prompt_name": self.prompt_name})
        return head[:-1] + b',"inputs":[' + b",".join(encoded) + b"]}"


class RouteTokenCounter:
    """A token counter over the servers' ``POST /tokenize`` (see the module docstring).

    ``endpoints`` serve the same model; ``limits`` are the smallest of theirs (inputs per request,
    payload limit, inputs in flight). ``prompt_name`` is the job's ``model.prompt_name``: its tokens
    count with every input. ``max_chars`` is the
    servers' character limit per input (``max_input_length * 250``; ``None``: only the payload limit
    cuts texts into pieces).
    """

    def __init__(self, endpoints: Sequence[Endpoint], limits: ClientLimits, *, prompt_name: str | None = None,
                 cuts: str = CUTS_NONE, timeout: float = DEFAULT_TIMEOUT_S,
                 max_retries: int = DEFAULT_MAX_RETRIES, max_chars: int | None = None) -> None:
        if not endpoints:
            raise ValueError("a /tokenize counter needs at least one server")
        if cuts not in CUTS:
            raise ValueError(f"cuts must be one of {', '.join(CUTS)}, not {cuts!r}")
        self.endpoints = tuple(endpoints)
        self.cuts = cuts
        self.prompt_name = prompt_name
        self.max_retries = max_retries
        self.max_chars = max_chars
        self._timeout = timeout
        self._batch_cap = max(1, min(limits.max_batch_size, limits.max_inflight_inputs))
        known = [e.payload_limit for e in endpoints if e.payload_limit is not None]
        self._payload_limit = min([limits.payload_limit, *known])
        self._max_requests = max(1, min(DEFAULT_MAX_REQUESTS, limits.max_inflight_inputs // self._batch_cap))
        self._special_tokens: int | None = None
        self._requests = self._inputs = self._retries = 0
        self._turn = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._http: httpx.AsyncClient | None = None
        self._clients: list[TeiClient] = []
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"RouteTokenCounter({', '.join(e.url for e in self.endpoints)})"

    def __enter__(self) -> RouteTokenCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def special_tokens(self) -> int:
        """Tokens the server adds to every input (special tokens, and the prompt's); asked once."""
        if self._special_tokens is None:
            total = self.counts([PROBE_TEXT])[0]
            self._special_tokens = total - len(self.offsets([PROBE_TEXT])[0])
        return self._special_tokens

    @property
    def stats(self) -> TokenizeStats:
        """What was sent so far."""
        return TokenizeStats(self._requests, self._inputs, self._retries)

    def offsets(self, texts: Sequence[str]) -> list[Spans]:
        """Character spans of each text's tokens, special tokens left out (a long text's in pieces)."""
        ask = _Ask(special=False, prompt_name=None)
        pieces = [self._pieces(text, ask) for text in texts]
        flat = [text[start:end] for text, bounds in zip(texts, pieces, strict=True) for start, end in bounds]
        tokens = iter(self._call(self._tokenize(flat, ask)))
        spans: list[Spans] = []
        for text, bounds in zip(texts, pieces, strict=True):
            joined: Spans = []
            for start, end in bounds:
                joined.extend((a + start, b + start) for a, b in char_spans(text[start:end], next(tokens)[1]))
            spans.append(joined)
        return spans

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens as the server counts them: special tokens and the prompt's included (a long
        text's pieces' counts, less what the server adds to every input for each piece after the first)."""
        ask = _Ask(special=True, prompt_name=self.prompt_name)
        pieces = [self._pieces(text, ask) for text in texts]
        if self._special_tokens is None and any(len(bounds) != 1 for bounds in pieces):
            _ = self.special_tokens  # an empty text counts it; so does each piece after a long text's first
        flat = [text[start:end] for text, bounds in zip(texts, pieces, strict=True) for start, end in bounds]
        answers = iter(self._call(self._tokenize(flat, ask)))
        added = self._special_tokens or 0
        return [sum(next(answers)[0] for _ in bounds) - added * (len(bounds) - 1) for bounds in pieces]

    def _pieces(self, text: str, ask: _Ask) -> list[tuple[int, int]]:
        """``text`` as ``(start, end)`` pieces that the servers take: one unless it is over ``max_chars``
        or its JSON over the payload limit; none for ``""``, which is answered without asking."""
        if not text:
            return []
        limit = len(text) if self.max_chars is None else self.max_chars
        bounds = piece_bounds(text, limit)
        room = self._payload_limit - len(ask.body([b'""']))
        fitted: list[tuple[int, int]] = []
        while bounds:
            start, end = bounds.pop(0)
            size = len(orjson.dumps(text[start:end]))
            if size <= room or end - start <= 1:
                fitted.append((start, end))  # a lone character over the limit: the server says so
                continue
            smaller = max(1, (end - start) * room // size)  # at most this many characters fit, on average
            bounds[:0] = [(start + a, start + b) for a, b in piece_bounds(text[start:end], smaller)]
        return fitted

    def close(self) -> None:
        """Close the connections and stop the background thread; the counter cannot be used after."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if self._http is not None:
            asyncio.run_coroutine_threadsafe(self._http.aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the counter's loop and wait for it (from any thread but that loop's)."""
        try:
            loop = self._start()
            if threading.current_thread() is self._thread:
                raise RuntimeError("a RouteTokenCounter cannot be called from its own event loop")
        except BaseException:
            coroutine.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("this RouteTokenCounter is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="teibatch-tokenize", daemon=True)
                thread.start()
                asyncio.run_coroutine_threadsafe(self._open(), loop).result()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _open(self) -> None:
        """The connection pool and the request slots, made on the loop that uses them."""
        from teibatch.tei.transport import open_client  # aiohttp only once a request is to be sent

        urls = [e.url for e in self.endpoints]
        self._http = open_client(urls, max_connections=self._max_requests)
        self._clients = [TeiClient(e, self._http, timeout=self._timeout) for e in self.endpoints]
        self._slots = asyncio.Semaphore(self._max_requests)

    async def _tokenize(self, texts: Sequence[str], ask: _Ask) -> list[tuple[int, Spans]]:
        """Per text: its token count and its byte spans (special tokens left out); ``(0, [])`` for ``""``."""
        answers: list[tuple[int, Spans]] = [(0, []) for _ in texts]
        positions = [i for i, text in enumerate(texts) if text]
        encoded = [orjson.dumps(texts[i]) for i in positions]
        await _together(self._send(ask, batch, answers) for batch in self._pack(ask, positions, encoded))
        return answers

    def _pack(self, ask: _Ask, positions: list[int],
              encoded: list[bytes]) -> list[list[tuple[int, bytes]]]:
        """The texts in order, cut into requests within the inputs and bytes a request may carry."""
        batches: list[list[tuple[int, bytes]]] = []
        fixed = len(ask.body([]))
        batch: list[tuple[int, bytes]] = []
        size = fixed
        for position, text in zip(positions, encoded, strict=True):
            if fixed + len(text) > self._payload_limit:
                raise PayloadTooLarge(
                    f"a piece of text of {len(text):,} bytes (as JSON, one character) does not fit the payload "
                    f"limit of {self._payload_limit:,} bytes even alone, so /tokenize cannot count it; give the "
                    "chunker the model's tokenizer.json, or raise the servers' --payload-limit",
                    server=self.endpoints[0].url)
            if batch and (len(batch) >= self._batch_cap or size + 1 + len(text) > self._payload_limit):
                batches.append(batch)
                batch, size = [], fixed
            size += len(text) + (1 if batch else 0)
            batch.append((position, text))
        if batch:
            batches.append(batch)
        return batches

    async def _send(self, ask: _Ask, batch: list[tuple[int, bytes]], answers: list[tuple[int, Spans]]) -> None:
        """One request's texts, until answered: retried, or sent again in smaller requests."""
        assert self._slots is not None
        body = ask.body([text for _, text in batch])
        attempts = overloads = 0
        while True:
            client = self._clients[self._turn % len(self._clients)]
            self._turn += 1
            try:
                async with self._slots:
                    self._requests += 1
                    self._inputs += len(batch)
                    content = await client.tokenize(body)
                parsed = _read_answer(content, len(batch), server=client.url)
            except TeiOverloaded as exc:
                if overloads >= MAX_OVERLOAD_RETRIES:
                    raise
                wait = min(exc.retry_after, MAX_RETRY_AFTER_S) if exc.retry_after is not None else backoff(overloads)
                overloads += 1
            except TeiUnavailable:  # no answer, 5xx, a wrong 200
                if attempts >= self.max_retries:
                    raise
                wait = backoff(attempts, base=0.1)  # as the embedder waits before resending elsewhere
                attempts += 1
            except (PayloadTooLarge, TooManyInputs) as exc:
                if len(batch) == 1:
                    raise
                if isinstance(exc, PayloadTooLarge):
                    self._payload_limit = min(self._payload_limit, len(body) - 1)
                else:
                    self._batch_cap = max(1, min(self._batch_cap, len(batch) // 2))
                smaller = self._pack(ask, [p for p, _ in batch], [t for _, t in batch])
                await _together(self._send(ask, part, answers) for part in smaller)
                return
            else:
                for (position, _), answer in zip(batch, parsed, strict=True):
                    answers[position] = answer
                return
            self._retries += 1
            await asyncio.sleep(wait)


async def _together(coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``coroutines`` side by side; the first to fail cancels the others, then its error is raised."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _read_answer(content: bytes, inputs: int, *, server: str) -> list[tuple[int, Spans]]:
    """``/tokenize``'s answer: per input, its token count and the byte spans of its non-special tokens.

    Anything but one list of tokens per input, each non-special token with offsets ``0 <= start <=
    stop``, is a ``bad body`` :class:`~teibatch.errors.ServerFault`.
    """
    try:
        data = orjson.loads(content)
        if not isinstance(data, list) or len(data) != inputs:
            raise ValueError(f"{len(data) if isinstance(data, list) else 'no'} token lists for {inputs} inputs")
        answers = []
        for tokens in data:
            spans = [(int(t["start"]), int(t["stop"])) for t in tokens if not t["special"]]
            if any(not 0 <= start <= stop for start, stop in spans):
                raise ValueError("token offsets out of order")
            answers.append((len(tokens), spans))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ServerFault(f"answered 200 to /tokenize with a body that is not its JSON ({exc})", server=server,
                          kind=FAULT_BAD_BODY) from exc
    return answers


def piece_bounds(text: str, limit: int) -> list[tuple[int, int]]:
    """``text`` as consecutive ``(start, end)`` pieces of at most ``limit`` characters, together all of it.

    A piece ends where the last run of whitespace within its reach starts, so the next piece starts
    with that whitespace and no word or token is cut; where there is none, at the last whitespace
    within reach, else after ``limit`` characters (see the module docstring for what then holds).
    """
    if limit < 1:
        raise ValueError(f"a piece holds at least one character, not {limit}")
    bounds: list[tuple[int, int]] = []
    start = 0
    while len(text) - start > limit:
        reach = start + limit + 1  # a cut at start + limit leaves a piece of exactly limit characters
        cut = _last(_RUN_START, text, start + 1, reach) or _last(_SPACE, text, start + 1, reach) or reach - 1
        bounds.append((start, cut))
        start = cut
    bounds.append((start, len(text)))
    return bounds


def _last(pattern: re.Pattern[str], text: str, start: int, end: int) -> int | None:
    """Where the last match of ``pattern`` in ``text[start:end]`` starts (lookbehind sees before ``start``)."""
    last = deque(pattern.finditer(text, start, end), maxlen=1)
    return last[0].start() if last else None


def char_spans(text: str, spans: Spans) -> Spans:
    """Byte spans into ``text``'s UTF-8 as character spans into ``text`` (a token's start inside a
    character moves to that character's start, its end to that character's end)."""
    if not spans or text.isascii():
        return spans
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    widths = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)
    edges = np.zeros(len(codes) + 1, dtype=np.int64)
    np.cumsum(widths, out=edges[1:])
    pairs = np.asarray(spans, dtype=np.int64)
    pairs = np.minimum(pairs, edges[-1])  # a wrong server's offsets past the end: the end
    starts = np.searchsorted(edges, pairs[:, 0], side="right") - 1
    stops = np.searchsorted(edges, pairs[:, 1], side="left")
    return list(zip(np.minimum(starts, len(codes)).tolist(), stops.tolist(), strict=True))
