"""``asyncio.gather`` over ``/embed``: the common "fast" script, and the same loop tuned per server.

* ``sem8``: every batch of 32 is a task, ``asyncio.Semaphore(8)`` caps requests in flight, servers
  taken in turn (the pattern of most "embed faster with asyncio" posts);
* ``budget``: per server ``max_concurrent_requests // max_client_batch_size`` workers (read from the
  server's ``/info``), each sending one full batch at a time, so every server holds exactly its
  budget of inputs in flight; 429 and 503 answers are sent again after 50 ms.

Neither handles a refused document: a 4xx fails ``gather`` and the script.
"""

from __future__ import annotations

import asyncio
from collections import deque

import httpx

from contestants.common import Config, main, read_documents, write_vectors

BATCH = 32
SEMAPHORE = 8
RETRY_STATUSES = (429, 503)


async def embed_sem8(config: Config, texts: list[object]) -> list[list[float]]:
    semaphore = asyncio.Semaphore(SEMAPHORE)
    headers = {"Authorization": f"Bearer {config.api_key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:

        async def embed(index: int, batch: list[object]) -> list[list[float]]:
            async with semaphore:
                url = config.urls[index % len(config.urls)]
                response = await client.post(f"{url}/embed", json={"inputs": batch})
                response.raise_for_status()
                return list(response.json())

        batches = [texts[start:start + BATCH] for start in range(0, len(texts), BATCH)]
        results = await asyncio.gather(*(embed(i, b) for i, b in enumerate(batches)))
    return [vector for batch in results for vector in batch]


async def embed_budget(config: Config, texts: list[object]) -> list[list[float]]:
    headers = {"Authorization": f"Bearer {config.api_key}"}
    vectors: list[list[float]] = [[] for _ in texts]
    async with httpx.AsyncClient(headers=headers, timeout=60, limits=httpx.Limits(max_connections=None)) as client:
        infos = [(await client.get(f"{url}/info")).json() for url in config.urls]
        batch_size = min(info["max_client_batch_size"] for info in infos)
        work = deque((start, texts[start:start + batch_size]) for start in range(0, len(texts), batch_size))

        async def worker(url: str) -> None:
            while work:
                start, batch = work.popleft()
                response = await client.post(f"{url}/embed", json={"inputs": batch})
                if response.status_code in RETRY_STATUSES:
                    work.append((start, batch))
                    await asyncio.sleep(0.05)
                    continue
                response.raise_for_status()
                vectors[start:start + len(batch)] = response.json()

        budgets = [max(1, info["max_concurrent_requests"] // batch_size) for info in infos]
        # Workers interleaved across servers, so the first batches are spread over all of them.
        await asyncio.gather(*(worker(url) for k in range(max(budgets))
                               for url, budget in zip(config.urls, budgets, strict=True) if k < budget))
    return vectors


def run(config: Config) -> None:
    ids, texts = read_documents(config.corpus)
    embed = embed_sem8 if config.variant == "sem8" else embed_budget
    write_vectors(config, ids, asyncio.run(embed(config, texts)))


if __name__ == "__main__":
    main(run)
