"""The driver's head start: the first shard's first texts, sent before its task runs, used only if they match."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from unittest.mock import patch

import httpx
import numpy as np
import pytest
import ray

from teibatch.corpus import CorpusOptions, plan_shards
from teibatch.endpoint import Endpoint
from teibatch.pipeline.head_start import HeadStart, HeadStartTexts, SentChunk, send_head_start, texts_digest
from teibatch.pipeline.senders.actor import launch_senders, probed_senders, start_senders, stop_senders
from teibatch.pipeline.senders.core import SenderCore
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan, plan_senders
from teibatch.pipeline.senders.sending import embed_through_senders
from teibatch.server import HashingEmbedder, text_digest
from teibatch.server.testing import running_server
from teibatch.tei import ClientLimits, EmbedOptions
from tests.conftest import write_jsonl


def plan_for(url: str, dimension: int | None = 384, batch: int = 4) -> SenderPlan:
    limits = ClientLimits(max_batch_size=batch, max_inflight_inputs=8, payload_limit=2_000_000)
    (plan,) = plan_senders(SenderPlan((ServerPlan(Endpoint(url), limits),), "embed", EmbedOptions(), dimension,
                                      request_timeout=30, max_retries=3))
    return plan


def sender_for(url: str, batch: int = 4) -> SenderRef:
    (sender,) = start_senders([plan_for(url, batch=batch)])
    return sender


def embedded_texts(url: str) -> Counter[str]:
    return Counter(httpx.get(f"{url}/teibatch/stats", timeout=10).json()["texts"])


def head_of(texts: list[str], sender: SenderRef) -> HeadStart:
    """What the driver does: the texts sent as chunks, remembered with their digest."""
    size = sender.chunk_size
    chunks = tuple(SentChunk(start, len(texts[start:start + size]), 0,
                             sender.actor.embed.remote(texts[start:start + size], 0.0, sender.plan))
                   for start in range(0, len(texts), size))
    return HeadStart(len(texts), texts_digest(texts), chunks)


@pytest.mark.timeout(120)
def test_the_task_takes_the_drivers_results_for_the_texts_it_sent(ray_session: None) -> None:
    texts = [f"text {i}" for i in range(100)]
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, record_texts=True) as url:
        sender = sender_for(url)
        try:
            head = head_of(texts[:40], sender)
            result = embed_through_senders(iter(texts), [sender], 384, head=head)
        finally:
            stop_senders([sender.actor])
        seen = embedded_texts(url)
    assert result.ok.all() and not result.failures
    np.testing.assert_allclose(result.vectors, HashingEmbedder(384).embed(texts), atol=1e-6)
    assert seen == Counter(text_digest(t) for t in texts)  # the first 40 were not sent a second time


@pytest.mark.timeout(120)
def test_texts_other_than_the_drivers_are_sent_again(ray_session: None) -> None:
    # The corpus changed between the driver's reading and the task's: the task's own texts count.
    driver_read = [f"old text {i}" for i in range(40)]
    texts = [f"new text {i}" for i in range(60)]
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, record_texts=True) as url:
        sender = sender_for(url)
        try:
            result = embed_through_senders(iter(texts), [sender], 384, head=head_of(driver_read, sender))
        finally:
            stop_senders([sender.actor])
        seen = embedded_texts(url)
    assert result.ok.all() and not result.failures
    np.testing.assert_allclose(result.vectors, HashingEmbedder(384).embed(texts), atol=1e-6)
    assert seen == Counter(text_digest(t) for t in driver_read + texts)


@pytest.mark.timeout(120)
def test_the_driver_sends_the_first_shards_first_documents(tmp_path: Path, ray_session: None) -> None:
    rows = [{"id": f"d{i}", "text": f"document {i}"} for i in range(30)]
    del rows[3]["text"]  # rejected while reading: the task would not send it either
    write_jsonl(tmp_path / "c" / "a.jsonl", rows)
    options = CorpusOptions(str(tmp_path / "c"), id_field="id", shard_docs=25)
    first, _ = plan_shards(options)
    with running_server(max_client_batch_size=4, max_concurrent_requests=8) as url:
        sender, one_a_request = sender_for(url), sender_for(url, batch=1)  # the second: chunks of 8, a budget of 8
        try:
            head = send_head_start(HeadStartTexts(options, first), [sender])
            assert head is not None and head.count == 24  # the shard's 25 documents, less the one rejected
            assert head.digest == texts_digest(str(r["text"]) for r in rows[:25] if "text" in r)
            ahead = HeadStartTexts(options, first)
            ahead.read(3)  # what the driver reads while the senders start
            assert ahead.texts == [f"document {i}" for i in range(3)]
            with patch("teibatch.pipeline.head_start.MIN_HEAD_START_TEXTS", 5):
                head = send_head_start(ahead, [one_a_request])
            assert head is not None and head.count == 8  # read on to the sender's budget, when that is more
            assert head.digest == texts_digest(str(r["text"]) for r in rows[:9] if "text" in r)
            missing = send_head_start(HeadStartTexts(CorpusOptions(str(tmp_path / "gone"), id_field="id"), first),
                                      [sender])
        finally:
            stop_senders([sender.actor, one_a_request.actor])
    assert missing is None  # the task meets the same error and reports it


@pytest.mark.timeout(120)
def test_texts_sent_before_the_probe_wait_in_the_sender_for_its_plan(tmp_path: Path, ray_session: None) -> None:
    rows = [{"id": f"d{i}", "text": f"document {i}"} for i in range(100)]
    write_jsonl(tmp_path / "c" / "a.jsonl", rows)
    options = CorpusOptions(str(tmp_path / "c"), id_field="id", shard_docs=100)
    (shard,) = plan_shards(options)
    texts = [str(r["text"]) for r in rows]
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, record_texts=True) as url:
        early = plan_for(url, dimension=None)  # what the servers' /info tells, before their probe
        (actor,) = launch_senders([[Endpoint(url)]])
        try:
            first = HeadStartTexts(options, shard)
            first.send([SenderRef(actor, early)], 5)  # rounded up to a chunk: 8 x 4 texts
            early = first.head_start()
            assert early is not None and early.count == 32 and len(early.chunks) == 1
            waiting, _ = ray.wait([early.chunks[0].result], timeout=1.0)
            assert waiting == [] and embedded_texts(url) == Counter()  # no plan yet: nothing sent
            started = start_senders([plan_for(url, dimension=None)], [actor])
            (sender,) = probed_senders(started, 384)  # the probed plan: the chunk goes now
            with patch("teibatch.pipeline.head_start.MIN_HEAD_START_TEXTS", 40):
                head = send_head_start(first, [sender])
            assert head is not None and head.count == 64 and head.chunks[0] == early.chunks[0]
            assert head.digest == texts_digest(texts[:64])
            result = embed_through_senders(iter(texts), [sender], 384, head=head)
        finally:
            stop_senders([actor])
        seen = embedded_texts(url)
    assert result.ok.all() and not result.failures
    np.testing.assert_allclose(result.vectors, HashingEmbedder(384).embed(texts), atol=1e-6)
    assert seen == Counter(text_digest(t) for t in texts)  # each once: the task took the head start's results


def test_a_sender_embeds_nothing_before_it_knows_the_servers_vector_size() -> None:
    with pytest.raises(RuntimeError, match="probe has shown their vector size"):
        asyncio.run(SenderCore(plan_for("http://127.0.0.1:9", dimension=None)).embed(["a text"]))
