"""Reading a JSON request body the way axum's ``Json`` extractor does, and shaping it into records.

Order of checks, as in axum 0.7: Content-Type (415), body length against ``--payload-limit`` (413),
JSON syntax (400), then the target type (422, ``{path}: {serde message}``). The serde messages are
close imitations: a client may rely on the status and the fixed prefix, not on the detail.
Unknown fields are ignored, as TEI's request structs do not deny them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from aiohttp import web

from teibatch.server.responses import (
    JSON_SYNTAX_PREFIX,
    MISSING_JSON_CONTENT_TYPE,
    PAYLOAD_TOO_LARGE,
    Rejection,
    data_error,
)

U32_MAX = 2**32 - 1
USIZE_MAX = 2**64 - 1
DRAIN_LIMIT = 64 * 1024 * 1024
"""Bytes of an oversize body read and thrown away before answering 413, so the client sees the answer."""

Item = str | tuple[int, ...]
"""One input: a text, or token ids (a tuple, so it cannot be mistaken for a list of texts)."""

T = TypeVar("T")


class PayloadTooLargeError(Rejection):
    """413 with axum's text; a distinct type so the violation counter can see it."""

    def __init__(self) -> None:
        super().__init__(413, PAYLOAD_TOO_LARGE)


def is_json_content_type(value: str | None) -> bool:
    """axum's rule: ``application/json``, ``application/*+json``, parameters allowed."""
    if not value:
        return False
    mime = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or :class:`PayloadTooLargeError` past ``limit`` bytes (after a bounded drain)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        await _drain(request, 0)
        raise PayloadTooLargeError()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            await _drain(request, size)
            raise PayloadTooLargeError()
        chunks.append(chunk)
    return b"".join(chunks)


async def _drain(request: web.Request, already: int) -> None:
    read = already
    async for chunk in request.content.iter_any():
        read += len(chunk)
        if read > DRAIN_LIMIT:
            return


async def read_json(request: web.Request, limit: int) -> Any:
    """Content-Type, length, then syntax checks; the parsed JSON value."""
    if not is_json_content_type(request.headers.get("Content-Type")):
        raise Rejection(415, MISSING_JSON_CONTENT_TYPE)
    body = await read_body(request, limit)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Rejection(400, JSON_SYNTAX_PREFIX + _syntax_message(body, exc)) from exc


def _syntax_message(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """serde_json's wording for the usual syntax errors, with its line and column."""
    where = f"at line {exc.lineno} column {exc.colno}"
    if not body.strip() or "unexpected end" in exc.msg.lower() or "eof" in exc.msg.lower():
        lines = body.decode("utf-8", "replace").split("\n")
        return f"EOF while parsing a value at line {len(lines)} column {len(lines[-1])}"
    if "trailing" in exc.msg.lower() or "after document" in exc.msg.lower():
        return f"trailing characters {where}"
    if "utf-8" in exc.msg.lower():
        return f"invalid unicode code point {where}"
    return f"expected value {where}"


def _describe(value: Any) -> str:
    """serde's ``Unexpected`` wording for a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {orjson.dumps(value).decode()}"
    if isinstance(value, list):
        return "sequence"
    return "map"


class _Fields:
    """Typed access to the fields of one request object, raising axum's 422 on a wrong type."""

    def __init__(self, value: Any, struct: str) -> None:
        if not isinstance(value, dict):
            raise data_error("", f"invalid type: {_describe(value)}, expected struct {struct}")
        self.value = value

    def required(self, name: str) -> Any:
        if name not in self.value:
            raise data_error("", f"missing field `{name}`")
        return self.value[name]

    def boolean(self, name: str, default: bool) -> bool:
        value = self.value.get(name, default)
        if not isinstance(value, bool):
            raise data_error(name, f"invalid type: {_describe(value)}, expected a boolean")
        return value

    def string(self, name: str, *, required: bool = False) -> str | None:
        value = self.required(name) if required else self.value.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise data_error(name, f"invalid type: {_describe(value)}, expected a string")
        return value

    def usize(self, name: str) -> int | None:
        value = self.value.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise data_error(name, f"invalid type: {_describe(value)}, expected usize")
        if isinstance(value, float) or not 0 <= value <= USIZE_MAX:
            raise data_error(name, f"invalid value: {_describe(value)}, expected usize")
        return value

    def choice(self, name: str, default: str, accepted: dict[str, str], expected: str) -> str:
        value = self.value.get(name, default)
        if not isinstance(value, str):
            raise data_error(name, f"invalid type: {_describe(value)}, expected {expected}")
        if value not in accepted:
            raise data_error(name, f"unknown variant `{value}`, expected {expected}")
        return accepted[value]

    def truncation(self) -> tuple[bool | None, str]:
        """``truncate`` (None when missing or null: the server's ``--auto-truncate``), then the direction."""
        truncate = None if self.value.get("truncate") is None else self.boolean("truncate", False)
        return truncate, self.choice("truncation_direction", "right", _DIRECTIONS, _DIRECTION_EXPECTED)


_DIRECTIONS = {"Left": "left", "left": "left", "Right": "right", "right": "right"}
_DIRECTION_EXPECTED = "one of `Left`, `left`, `Right`, `right`"


def _ids(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= U32_MAX:
            return None
    return tuple(value)


def _input_type(value: Any) -> Item | None:
    if isinstance(value, str):
        return value
    return _ids(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _untagged(value: Any, name: str, enum: str, one: Callable[[Any], T | None],
              element: Callable[[Any], T | None] | None = None) -> tuple[list[T], bool]:
    """A serde untagged enum of one value or a list of them: (items, is_batch), else 422.

    ``one`` reads a single value (None: not one); ``element`` reads a list's entries (default ``one``).
    """
    single = one(value)
    if single is not None:
        return [single], False
    if isinstance(value, list):
        items = [(element or one)(v) for v in value]
        if all(item is not None for item in items):
            return [item for item in items if item is not None], True
    raise data_error(name, f"data did not match any variant of untagged enum {enum}")


def parse_input(value: Any, name: str) -> tuple[list[Item], bool]:
    """TEI's untagged ``Input``: (items, is_batch). ``[]`` is one empty token-id input, as in TEI."""
    return _untagged(value, name, "Input", _input_type)


@dataclass(frozen=True)
class EmbedParams:
    """``/embed``, ``/embed_sparse``, ``/embed_all`` and (with fixed options) the OpenAI route."""

    items: list[Item]
    is_batch: bool
    truncate: bool | None = None
    direction: str = "right"
    prompt_name: str | None = None
    normalize: bool = True
    dimensions: int | None = None
    encoding_format: str = "float"


def parse_embed(value: Any, struct: str = "EmbedRequest") -> EmbedParams:
    """An ``EmbedRequest`` (or ``EmbedSparseRequest``/``EmbedAllRequest``; extra fields are ignored)."""
    fields = _Fields(value, struct)
    items, is_batch = parse_input(fields.required("inputs"), "inputs")
    normalize = fields.boolean("normalize", True)
    truncate, direction = fields.truncation()
    return EmbedParams(
        items=items, is_batch=is_batch,
        truncate=truncate, direction=direction,
        prompt_name=fields.string("prompt_name"),
        normalize=normalize,
        dimensions=fields.usize("dimensions"),
    )


def parse_openai(value: Any) -> EmbedParams:
    """An ``OpenAICompatRequest``: ``model`` and ``user`` are read (type-checked) and ignored."""
    fields = _Fields(value, "OpenAICompatRequest")
    items, is_batch = parse_input(fields.required("input"), "input")
    fields.string("model")
    fields.string("user")
    encoding = fields.choice("encoding_format", "float", {"float": "float", "base64": "base64"},
                             "`float` or `base64`")
    return EmbedParams(items=items, is_batch=is_batch, dimensions=fields.usize("dimensions"),
                       encoding_format=encoding)


@dataclass(frozen=True)
class RerankParams:
    """``/rerank``: one query against ``texts``."""

    query: str
    texts: list[str]
    truncate: bool | None
    direction: str
    raw_scores: bool
    return_text: bool


def _string_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list):
        raise data_error(name, f"invalid type: {_describe(value)}, expected a sequence")
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise data_error(f"{name}[{i}]", f"invalid type: {_describe(v)}, expected a string")
    return list(value)


def parse_rerank(value: Any) -> RerankParams:
    """A ``RerankRequest``."""
    fields = _Fields(value, "RerankRequest")
    query = fields.string("query", required=True)
    texts = _string_list(fields.required("texts"), "texts")
    truncate, direction = fields.truncation()
    return RerankParams(
        query=str(query), texts=texts,
        truncate=truncate, direction=direction,
        raw_scores=fields.boolean("raw_scores", False),
        return_text=fields.boolean("return_text", False),
    )


@dataclass(frozen=True)
class TokenizeParams:
    """``/tokenize``: texts only (no token ids), never truncated."""

    texts: list[str]
    is_batch: bool
    add_special_tokens: bool
    prompt_name: str | None


def parse_tokenize(value: Any) -> TokenizeParams:
    """A ``TokenizeRequest`` (``inputs``: a string or a list of strings)."""
    fields = _Fields(value, "TokenizeRequest")
    texts, is_batch = _untagged(fields.required("inputs"), "inputs", "TokenizeInput", _text)
    return TokenizeParams(texts, is_batch, fields.boolean("add_special_tokens", True), fields.string("prompt_name"))


@dataclass(frozen=True)
class DecodeParams:
    """``/decode``: token ids back to text."""

    ids: list[tuple[int, ...]]
    is_batch: bool
    skip_special_tokens: bool


def parse_decode(value: Any) -> DecodeParams:
    """A ``DecodeRequest`` (``ids``: ``[u32]`` or ``[[u32]]``; ``[]`` is one empty list)."""
    fields = _Fields(value, "DecodeRequest")
    ids, is_batch = _untagged(fields.required("ids"), "ids", "InputIds", _ids)
    return DecodeParams(ids, is_batch, fields.boolean("skip_special_tokens", True))


@dataclass(frozen=True)
class PredictParams:
    """``/predict``: each input a text or a (text, text) pair."""

    inputs: list[tuple[str, ...]]
    is_batch: bool
    truncate: bool | None
    direction: str
    raw_scores: bool


def _sequence(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return (value[0], value[1])
    return None


def _batch_sequence(value: Any) -> tuple[str, ...] | None:
    """An entry of a batch: a text or pair as :func:`_sequence`, or a text in a list of one."""
    return _sequence(value[0] if isinstance(value, list) and len(value) == 1 else value)


def parse_predict(value: Any) -> PredictParams:
    """A ``PredictRequest``: ``"a"``, a pair ``["a", "b"]`` (one input!), or ``[["a"], ["a", "b"]]``."""
    fields = _Fields(value, "PredictRequest")
    inputs, is_batch = _untagged(fields.required("inputs"), "inputs", "PredictInput", _sequence, _batch_sequence)
    truncate, direction = fields.truncation()
    return PredictParams(inputs, is_batch, truncate, direction, fields.boolean("raw_scores", False))


@dataclass(frozen=True)
class SimilarityParams:
    """``/similarity``: one source sentence against ``sentences``."""

    source: str
    sentences: list[str]
    truncate: bool | None
    direction: str
    prompt_name: str | None


def parse_similarity(value: Any) -> SimilarityParams:
    """A ``SimilarityRequest`` (``inputs`` object, optional ``parameters`` object)."""
    fields = _Fields(value, "SimilarityRequest")
    inputs = _Fields(fields.required("inputs"), "SimilarityInput")
    source = inputs.string("source_sentence", required=True)
    sentences = _string_list(inputs.required("sentences"), "inputs.sentences")
    parameters = value.get("parameters")
    params = _Fields(parameters if parameters is not None else {}, "SimilarityParameters")
    truncate, direction = params.truncation()
    return SimilarityParams(str(source), sentences, truncate, direction, params.string("prompt_name"))
