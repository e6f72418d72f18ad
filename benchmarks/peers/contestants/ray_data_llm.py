"""Ray Data LLM: ``HttpRequestProcessorConfig`` + ``build_processor`` -> ``write_parquet``.

``docs``: the example of ``ray.data.llm.HttpRequestProcessorConfig``'s docs with TEI's ``/embed`` as
the URL: one processor, one URL, ``concurrency=1``, one row (one document) a request, the config's
defaults otherwise (``batch_size=64``, ``qps=None``: "sent sequentially"). ``packed32``: rows packed
32 documents to a request, one processor per server over its share of the rows, ``concurrency=2``
each, the request stage's actors sharing one CPU (``num_cpus=1 / actors``) so the other stages keep
one. With ``features`` on (the probe), Ray Data's
``CheckpointConfig(id_column="id")`` as in :mod:`contestants.ray_data`.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from contestants.common import Config, main, ray_data_session


def pack(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """32 rows -> one row holding their ids and texts, and which server's share it is in."""
    return {"ids": [batch["id"].tolist()], "texts": [batch["text"].tolist()],
            "part": [zlib.crc32(str(batch["id"][0]).encode())]}


def unpack(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    ids = [i for row in batch["ids"] for i in row]
    vectors = [np.asarray(v, dtype=np.float32) for row in batch["embeddings"] for v in row]
    return {"id": ids, "embedding": np.stack(vectors) if vectors else np.zeros((0, 0), np.float32)}


def run(config: Config) -> None:
    import ray
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    with ray_data_session(config):
        headers = {"Authorization": f"Bearer {config.api_key}"}
        ds = ray.data.read_json(str(config.corpus))
        if config.variant == "docs":
            processor = build_processor(
                HttpRequestProcessorConfig(url=f"{config.urls[0]}/embed", headers=headers, concurrency=1),
                preprocess=lambda row: {"payload": {"inputs": row["text"]}},
                postprocess=lambda row: {"id": row["id"], "embedding": row["http_response"][0]},
            )
            out = processor(ds)
        else:
            packed = ds.map_batches(pack, batch_size=32)
            parts = []
            servers = len(config.urls)
            for index, url in enumerate(config.urls):
                processor = build_processor(
                    HttpRequestProcessorConfig(url=f"{url}/embed", headers=headers, concurrency=2,
                                               http_request_stage={"num_cpus": 1 / (2 * servers)}),
                    preprocess=lambda row: {"payload": {"inputs": list(row["texts"])}},
                    postprocess=lambda row: {"ids": row["ids"], "embeddings": row["http_response"]},
                )
                share = packed.filter(lambda row, i=index, n=servers: row["part"] % n == i)
                parts.append(processor(share))
            out = parts[0].union(*parts[1:]).map_batches(unpack)
        out.select_columns(["id", "embedding"]).write_parquet(str(config.vectors))


if __name__ == "__main__":
    main(run)
