"""teibatch: ``run_job(load_job(path))`` on a job file with a static ``servers.urls`` list.

The job names the corpus folder (``id_field: id``), the servers and ``api_key_env``, and the output
folder; everything else is left at teibatch's defaults (batch size and in-flight budget come from
each server's ``/info``). With ``features`` on (the probe), ``mode: incremental``, ``shard_docs: 100``
and ``limits.max_shards_in_flight: 2``: a run commits (and a rerun keeps) whole shards, 10,000
documents by default, and shards smaller than the servers' budget travel together and finish
together; on the probe's small corpus, small shards two at a time commit during the run as a real
job's 10,000-document shards do.
"""

from __future__ import annotations

import yaml

from contestants.common import Config, main


def run(config: Config) -> None:
    from teibatch.job import load_job
    from teibatch.pipeline import run_job

    job_path = config.state / "job.yaml"
    job_path.parent.mkdir(parents=True, exist_ok=True)
    job_path.write_text(yaml.safe_dump({
        "name": "peer-benchmark",
        **({"mode": "incremental"} if config.features else {}),
        "corpus": {"path": str(config.corpus), "id_field": "id", "text_field": "text",
                   **({"shard_docs": 100} if config.features else {})},
        "servers": {"provider": "static", "urls": config.urls, "api_key_env": config.raw["api_key_env"]},
        "output": {"path": str(config.output)},
        **({"limits": {"max_shards_in_flight": 2}} if config.features else {}),
    }))
    run_job(load_job(job_path))


if __name__ == "__main__":
    main(run)
