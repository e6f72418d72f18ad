"""Ray Data: ``read_json`` -> ``map_batches`` with a callable class holding an httpx client -> ``write_parquet``.

The "stateful transforms" pattern of Ray's docs (a class whose ``__init__`` sets up the client once
per actor, ``compute=ray.data.ActorPoolStrategy(size=2)``), ``batch_size=32`` for TEI's limit; each
call sends its batch to the next server in turn. ``actors8``: 2 actors per server, sharing one CPU
(``num_cpus=1 / actors``), so the read and write tasks keep the other: actors that hold every CPU
Ray declared leave the read task waiting forever (what ``size=2`` does on a 2-core machine). With ``features``
on (the probe), ``DataContext.checkpoint_config`` holds a ``CheckpointConfig(id_column="id")`` kept
after success (Ray Data's checkpointing, beta).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import httpx
import numpy as np

from contestants.common import Config, main, ray_data_session


class TEIEmbedder:
    """One per actor: an httpx client, and the servers taken in turn from a random start."""

    def __init__(self, urls: list[str], api_key: str) -> None:
        self.client = httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
        start = random.randrange(len(urls))
        self.urls = itertools.cycle(urls[start:] + urls[:start])

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        response = self.client.post(f"{next(self.urls)}/embed", json={"inputs": batch["text"].tolist()})
        response.raise_for_status()
        return {"id": batch["id"], "embedding": np.asarray(response.json(), dtype=np.float32)}


def run(config: Config) -> None:
    import ray

    with ray_data_session(config):
        actors = 2 * len(config.urls) if config.variant == "actors8" else 2
        ds = ray.data.read_json(str(config.corpus))
        ds = ds.map_batches(
            TEIEmbedder,
            fn_constructor_kwargs={"urls": config.urls, "api_key": config.api_key},
            compute=ray.data.ActorPoolStrategy(size=actors),
            batch_size=32,
            **({"num_cpus": 1 / actors} if config.variant == "actors8" else {}),
        )
        ds.select_columns(["id", "embedding"]).write_parquet(str(config.vectors))


if __name__ == "__main__":
    main(run)
