from __future__ import annotations

import orjson
import pytest

from teibatch.tei import (
    ROUTE_EMBED,
    ROUTE_EMBED_SPARSE,
    ROUTE_OPENAI_BASE64,
    EmbedOptions,
    RequestPacker,
    ServerInfo,
    choose_route,
)

INFO = ServerInfo.from_json({"model_id": "m", "model_type": {"embedding": {"pooling": "mean"}},
                             "max_client_batch_size": 32, "max_concurrent_requests": 512,
                             "max_input_length": 512, "auto_truncate": True})


def texts(n: int, size: int = 10) -> list[tuple[int, str]]:
    return [(i, f"t{i}-" + "é\n\"" * size) for i in range(n)]


@pytest.mark.parametrize("route", [pytest.param(ROUTE_EMBED, id="embed"),
                                   pytest.param(ROUTE_OPENAI_BASE64, id="openai-base64")])
def test_bodies_are_valid_json_with_every_input_in_order(route: str) -> None:
    packer = RequestPacker(route, EmbedOptions(dimensions=8), max_batch_size=7, payload_limit=10**6)
    items = texts(30)
    batches = list(packer.pack(items))
    assert [b.request.count for b in batches] == [7, 7, 7, 7, 2]
    seen = []
    for batch in batches:
        body = orjson.loads(batch.request.body)
        inputs = body["inputs"] if route == ROUTE_EMBED else body["input"]
        assert inputs == [items[p][1] for p in batch.positions]
        assert body["dimensions"] == 8
        seen += batch.positions
    assert seen == list(range(30))


def test_embed_body_sends_truncate_explicitly() -> None:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(truncate=False, truncation_direction="left"),
                           max_batch_size=4, payload_limit=10**6)
    (batch,) = packer.pack([(0, "x")])
    body = orjson.loads(batch.request.body)
    assert body == {"inputs": ["x"], "truncate": False, "truncation_direction": "Left", "normalize": True}


@pytest.mark.parametrize("limit", [pytest.param(300, id="300B"), pytest.param(1000, id="1KB"),
                                   pytest.param(5000, id="5KB")])
def test_bodies_never_exceed_payload_limit_and_fill_it(limit: int) -> None:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=1000, payload_limit=limit)
    items = texts(200, size=7)
    batches = list(packer.pack(items))
    piece = len(orjson.dumps(items[0][1]))
    for batch in batches:
        assert len(batch.request.body) <= limit
    for batch in batches[:-1]:
        # Greedy: the next input would not have fitted.
        assert len(batch.request.body) + piece + 1 > limit
    assert sum(b.request.count for b in batches) == 200


def test_split_halves_keep_positions() -> None:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=8, payload_limit=10**6)
    items = texts(5)
    (batch,) = packer.pack(items)
    halves = packer.split(batch, [t for _, t in items])
    assert [h.positions for h in halves] == [(0, 1), (2, 3, 4)]


@pytest.mark.parametrize(("options", "auto_truncate", "route"), [
    pytest.param(EmbedOptions(), True, ROUTE_OPENAI_BASE64, id="defaults-match-base64"),
    pytest.param(EmbedOptions(normalize=False), True, ROUTE_EMBED, id="no-normalize"),
    pytest.param(EmbedOptions(prompt_name="query"), True, ROUTE_EMBED, id="prompt-name"),
    pytest.param(EmbedOptions(truncation_direction="left"), True, ROUTE_EMBED, id="left-truncation"),
    pytest.param(EmbedOptions(truncate=True), False, ROUTE_EMBED, id="server-does-not-truncate"),
    pytest.param(EmbedOptions(truncate=False), False, ROUTE_OPENAI_BASE64, id="both-no-truncate"),
])
def test_auto_route(options: EmbedOptions, auto_truncate: bool, route: str) -> None:
    info = ServerInfo.from_json({**INFO.to_json(), "model_type": {"embedding": {}},
                                 "auto_truncate": auto_truncate})
    assert choose_route("auto", options, info) == route
    assert choose_route("embed", options, info) == ROUTE_EMBED


def test_old_servers_get_embed_not_base64() -> None:
    old = ServerInfo.from_json({**INFO.to_json(), "version": "1.2.3"})
    assert choose_route("auto", EmbedOptions(), old) == ROUTE_EMBED


SPLADE = ServerInfo.from_json({**INFO.to_json(), "model_type": {"embedding": {"pooling": "splade"}}})


@pytest.mark.parametrize(("kind", "info", "route"), [
    pytest.param("auto", SPLADE, ROUTE_EMBED_SPARSE, id="auto-splade-server"),
    pytest.param("auto", INFO, ROUTE_OPENAI_BASE64, id="auto-dense-server"),
    pytest.param("sparse", SPLADE, ROUTE_EMBED_SPARSE, id="sparse"),
    pytest.param("dense", SPLADE, ROUTE_OPENAI_BASE64, id="dense-asked-of-a-splade-server"),
])
def test_sparse_vectors_take_embed_sparse(kind: str, info: ServerInfo, route: str) -> None:
    assert choose_route("auto", EmbedOptions(kind=kind), info) == route


def test_sparse_body_has_no_dense_options_and_truncating_stays_sparse() -> None:
    options = EmbedOptions(truncate=False, normalize=True, dimensions=8, prompt_name="query", kind="sparse")
    packer = RequestPacker(ROUTE_EMBED_SPARSE, options, max_batch_size=4, payload_limit=10**6)
    (batch,) = packer.pack([(0, "x"), (1, "y")])
    assert orjson.loads(batch.request.body) == {"inputs": ["x", "y"], "truncate": False,
                                                "truncation_direction": "Right", "prompt_name": "query"}
    again = packer.truncating()
    assert again.route == ROUTE_EMBED_SPARSE
    assert orjson.loads(again.request([orjson.dumps("x")], 1).body)["truncate"] is True


@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("text", [pytest.param("abcd " * 500, id="ascii"),
                                  pytest.param("é\"\n€" * 300, id="escapes-and-multibyte")])
def test_cut_to_fit_keeps_the_longest_part_that_fits(direction: str, text: str) -> None:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(truncation_direction=direction), max_batch_size=4,
                           payload_limit=10**6)
    cut = packer.cut_to_fit(text, 1000)
    assert packer.fits_alone(orjson.dumps(cut), 1000)
    longer = text[len(text) - len(cut) - 1:] if direction == "left" else text[:len(cut) + 1]
    assert not packer.fits_alone(orjson.dumps(longer), 1000)
    assert text.endswith(cut) if direction == "left" else text.startswith(cut)


def test_truncating_packer_sends_truncate_true_on_embed() -> None:
    packer = RequestPacker(ROUTE_OPENAI_BASE64, EmbedOptions(truncate=False, dimensions=8), max_batch_size=4,
                           payload_limit=10**6).truncating()
    body = orjson.loads(packer.request([orjson.dumps("x")], 1).body)
    assert body == {"inputs": ["x"], "truncate": True, "truncation_direction": "Right", "normalize": True,
                    "dimensions": 8}


def test_on_too_long_is_checked() -> None:
    with pytest.raises(ValueError, match="on_too_long"):
        EmbedOptions(on_too_long="skip")
    assert EmbedOptions(truncate=False, on_too_long="truncate").may_truncate
    assert not EmbedOptions(truncate=False).may_truncate


def test_package_only_re_exports_with_a_sorted_all() -> None:
    import teibatch.tei as tei

    def isort_style(name: str) -> tuple[int, str]:  # constants, classes, functions (ruff RUF022)
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert tei.__all__ == sorted(tei.__all__, key=isort_style)
    assert all(hasattr(tei, name) for name in tei.__all__)
