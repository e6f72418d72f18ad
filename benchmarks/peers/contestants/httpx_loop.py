"""A plain sequential ``httpx`` loop over ``/embed``, 32 documents a request, one server.

The loop most people write first: TEI's README shows ``curl 127.0.0.1:8080/embed -X POST -d
'{"inputs":"What is Deep Learning?"}'``; this is that request in a loop, at TEI's batch limit.
"""

from __future__ import annotations

import httpx

from contestants.common import Config, main, read_documents, write_vectors

BATCH = 32


def run(config: Config) -> None:
    ids, texts = read_documents(config.corpus)
    vectors: list[list[float]] = []
    headers = {"Authorization": f"Bearer {config.api_key}"}
    with httpx.Client(base_url=config.urls[0], headers=headers, timeout=60) as client:
        for start in range(0, len(texts), BATCH):
            response = client.post("/embed", json={"inputs": texts[start:start + BATCH]})
            response.raise_for_status()
            vectors.extend(response.json())
    write_vectors(config, ids, vectors)


if __name__ == "__main__":
    main(run)
