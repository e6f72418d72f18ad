"""A fake Vast.ai whose instances are real: each is a ``teibatch serve --api-key …`` process on 127.0.0.1.

Every request is checked against Vast's own OpenAPI file (``../shared/clouds/vast-openapi.yaml``,
:mod:`tests.fleet.cloudspec`) and refused as Vast refuses it (400 ``{"success": false, "error":
"invalid_args", "msg": …}`` naming the field; a route the spec lacks, such as the deprecated v0
instance list, is 404); every answer is checked against the spec too (``answer_problems``, asserted
empty by the fixture; a 5xx fault is checked only where the spec declares one).

Checked against Vast.ai's API reference (``docs.vast.ai/api-reference``: search offers, create
instance, show instance(s), destroy instance; server ``https://console.vast.ai/api/v0``, bearer key)
and the ``vast-ai/vast-python`` CLI (``vast.py``: ``search__offers``, ``create__instance``,
``parse_env``, ``show__instances``, ``destroy_instance``):

* ``POST /api/v0/bundles/`` with a query ``{field: {op: value}, "type": "ondemand" | "bid", "order":
  [[field, "asc"], ...], "allocated_storage", "limit"}`` → ``{"offers": [offer...]}``; an offer has ``id``,
  ``gpu_name``, ``num_gpus``, ``gpu_ram`` (MB), ``compute_cap`` (×100), ``dph_total``, ``min_bid``,
  ``reliability2``, ``verified``, ``rentable``
* ``PUT /api/v0/asks/{id}/`` with ``client_id``, ``image``, ``label``, ``disk``, ``runtype``, ``onstart``,
  ``args``, ``env`` (Docker flags: ``-e KEY=value``, ``-p 80:80``), ``price`` (a bid) → ``{"success": true,
  "new_contract": <instance id>}``; an offer rented already → 404 ``{"success": false, "error":
  "invalid_args", "msg": "error 404/3603: no_such_ask …"}`` (the spec's answer)
* ``GET /api/v1/instances?limit=&after_token=&select_filters=``
  → ``{"success", "instances": [...], "instances_found", "total_instances", "next_token"}``, keyset
  pages of ``page_size`` (25, Vast's maximum), ``select_filters`` by ``id`` or ``label`` (``eq``); an instance:
  ``id``, ``label``, ``actual_status`` (loading, running),
  ``intended_status``, ``cur_state`` (running; unloaded once destroyed), ``public_ipaddr``, ``ports``
  (``{"80/tcp": [{"HostIp": "0.0.0.0", "HostPort": "<port>"}]}``), ``dph_total``, ``is_bid``
* ``DELETE /api/v0/instances/{id}/`` → ``{"success": true}``; a destroyed instance answers 404 and is
  no longer listed
* ``POST /api/v0/instances/{id}/ssh/`` with ``{"ssh_key": <public key>}`` (the CLI's ``attach ssh``) →
  ``{"success": true}``; recorded in ``ssh_keys``

The container is the TEI image's command line run for real: ``runtype: args``, ``onstart`` (the entrypoint)
``timeout`` and ``args`` ``[-k, <s>, <deadline>, text-embeddings-router, <router args>]``; the fake runs
``timeout <deadline> python -m teibatch serve --api-key $API_KEY <router args>`` on a free port and
maps container port 80 to it. An SSH launch (``runtype: "ssh_direc ssh_proxy"``, what the CLI's ``--ssh
--direct`` sends) has no ``args``: Vast's entrypoint runs sshd and then ``onstart``, a shell line
``nohup timeout … text-embeddings-router … > <log> 2>&1 &``, which the fake runs the same way; the
router's ``--huggingface-hub-cache <dir>`` gets the model files TEI would download unless they are
there (a folder the test sshd reads: the sshd is every SSH instance's, so the instances of a test
share it), and container port 22 is mapped to ``ssh_port`` (the test sshd's, set by the test). A line
that waits for the seed first (``nohup sh -c <wait> seed-wait <marker> <seconds> timeout … &``) has its
wait run for real (the shell script, with ``true`` for the router), and the router started when it
ends. ``starts`` records, per instance, whether its router had to download the model and how long it
waited for the seed. Faults: ``taken`` (offer ids), ``min_bid_now`` (offer id → its minimum bid now: a
lower ``price`` answers 400 ``invalid_price``), ``end_as`` (the next instances' ``actual_status``:
``exited``, ``unknown`` or ``offline``, never ``running``), ``late_lists`` (a new instance is left out of
that many lists), ``stuck`` (that many instances stay
loading), ``fail_after_create`` (creates that make the instance, then answer 503), ``show_errors`` and
``destroy_errors`` (that many 502/503 answers); :meth:`FakeVast.preempt` stops an
instance as Vast does an outbid interruptible one.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.fleet.cloudspec import OpenApiSpec
from tests.fleet.fakehttp import ContainerFake, free_port
from tests.fleet.standin_docker import hub_files


def _offer(offer_id: int, gpu: str, ram_mb: int, cap: int, price: float, min_bid: float,
           reliability: float = 0.995) -> dict[str, Any]:
    return {"id": offer_id, "ask_contract_id": offer_id, "gpu_name": gpu, "num_gpus": 1, "gpu_ram": ram_mb,
            "compute_cap": cap, "dph_total": price, "min_bid": min_bid, "reliability2": reliability,
            "verified": True, "rentable": True, "rented": False, "external": False}


OFFERS = [
    _offer(1001, "RTX 4090", 24564, 890, 0.40, 0.25),
    _offer(1002, "RTX 4090", 24564, 890, 0.45, 0.29),
    _offer(1003, "RTX A6000", 49140, 860, 0.47, 0.35),
    _offer(1004, "Tesla V100", 16384, 700, 0.12, 0.05),
    _offer(1005, "RTX 4090", 24564, 890, 0.30, 0.20, reliability=0.80),
    _offer(1006, "H100 SXM", 81559, 900, 2.20, 1.40),
    _offer(1007, "RTX 3090", 24576, 860, 0.22, 0.10, reliability=0.99),
]
CREATE_FIELDS = {"client_id", "image", "label", "disk", "runtype", "onstart", "args", "env", "price"}
SSH_RUNTYPE = "ssh_direct"
SPEC_FILE = "vast-openapi.yaml"
OPS = {"eq": lambda a, b: a == b, "gte": lambda a, b: a >= b, "lte": lambda a, b: a <= b,
       "in": lambda a, b: a in b}


def parse_env(flags: str) -> dict[str, str]:
    """The create call's ``env`` (Docker flags) as the CLI's ``parse_env`` reads it: ``-e K=V`` → ``{K: V}``,
    ``-p A:B`` → ``{"-p A:B": "1"}``."""
    words, env = shlex.split(flags), {}
    for flag, value in zip(words[::2], words[1::2], strict=True):
        assert flag in ("-e", "-p"), flags
        if flag == "-e":
            key, _, val = value.partition("=")
            env[key] = val
        else:
            env[f"-p {value}"] = "1"
    return env


class FakeVast(ContainerFake):
    """Vast's offers and instances (the spec's answers); ``searches``, ``creates`` (each body as the container
    sees it, ``env`` parsed, ``sent_env`` as sent), ``create_attempts`` and ``destroys`` record calls."""

    def refuse(self, status: int, problems: list[str]) -> tuple[int, Any]:
        return status, {"success": False, "error": "invalid_args" if status == 400 else "not_found",
                        "msg": "; ".join(problems)}

    def server_error(self) -> tuple[int, Any]:
        return 503, {"success": False, "error": "server_error", "msg": "Service Unavailable"}

    def too_many(self, retry_after: int) -> tuple[int, Any]:
        return 429, {"success": False, "error": "rate_limit_exceeded",
                     "msg": "API requests too frequent endpoint threshold=2.0"}


    def __init__(self, api_key: str, workdir: Path, spec: OpenApiSpec) -> None:
        super().__init__(api_key, workdir)
        self.spec = spec
        self.offers = [dict(o) for o in OFFERS]
        self.instances: dict[int, dict[str, Any]] = {}
        self.searches: list[dict[str, Any]] = []
        self.creates: list[dict[str, Any]] = []
        self.create_attempts: list[int] = []
        self.destroys: list[int] = []
        self.taken: set[int] = set()
        self.min_bid_now: dict[int, float] = {}
        self.end_as: list[str] = []
        self.late_lists = 0
        self.page_size = 25
        self._hidden: dict[int, int] = {}
        self.stuck = 0
        self.fail_after_create = 0
        self.show_errors = 0
        self.destroy_errors = 0
        self.ssh_port: int | None = None
        self.ssh_keys: dict[int, str] = {}
        self.starts: dict[int, dict[str, Any]] = {}
        self.closed = False
        self._ids = itertools.count(7_000_001)
        self.route("POST", "/api/v0/bundles/", self._search)
        self.route("PUT", r"/api/v0/asks/(?P<id>\d+)/", self._create)
        self.route("GET", "/api/v1/instances/?", self._list)
        self.route("DELETE", r"/api/v0/instances/(?P<id>\d+)/", self._destroy)
        self.route("POST", r"/api/v0/instances/(?P<id>\d+)/ssh/", self._attach)

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v0"

    def alive(self) -> int:
        """Instances not destroyed, and instance processes still running: both must end at 0."""
        with self.lock:
            live = sum(1 for i in self.instances.values() if i["cur_state"] != "unloaded")
            return live + self.running()

    def preempt(self, instance_id: int) -> None:
        """An interruptible instance outbid (or a machine gone offline): Vast stops it, and its container with it.
        The contract stays until destroyed: ``actual_status`` ``exited``, ``intended_status`` ``stopped``."""
        with self.lock:
            self.instances[instance_id].update(actual_status="exited", intended_status="stopped",
                                               status_msg="outbid: the instance was stopped")
        self.kill(instance_id)

    def serving(self) -> list[int]:
        """Instances running their container now, oldest first."""
        with self.lock:
            return [i for i, row in self.instances.items() if row["actual_status"] == "running"
                    and row["cur_state"] != "unloaded" and self.processes.get(i) is not None
                    and self.processes[i].poll() is None]

    def _search(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        kind = body["type"]
        assert kind in ("ondemand", "bid"), kind
        [order_field, direction], *_ = body["order"]
        assert direction == "asc" and isinstance(body["allocated_storage"], int | float)
        filters = {k: v for k, v in body.items() if k not in ("type", "order", "allocated_storage", "limit")}
        with self.lock:
            self.searches.append(body)
            found = [o for o in self.offers
                     if all(OPS[op](o[field], value) for field, cond in filters.items() for op, value in cond.items())]
        found.sort(key=lambda o: o[order_field])
        return 200, {"offers": found[:int(body.get("limit", 64))]}

    def _create(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        assert set(body) <= CREATE_FIELDS, set(body) - CREATE_FIELDS
        offer_id = int(match["id"])
        with self.lock:
            self.create_attempts.append(offer_id)
            offer = next((o for o in self.offers if o["id"] == offer_id), None)
            if offer is None or offer_id in self.taken:
                return 404, {"success": False, "error": "invalid_args",
                             "msg": f"error 404/3603: no_such_ask Instance type by id {offer_id} is not available."}
            min_bid = self.min_bid_now.get(offer_id, offer["min_bid"])
            if "price" in body and body["price"] < min_bid:
                return 400, {"success": False, "error": "invalid_price",
                             "msg": f"bid price {body['price']} is below the minimum bid {min_bid} of offer {offer_id}"}
            self.taken.add(offer_id)  # one machine: rented once
            instance_id = next(self._ids)
            sent_env = body["env"]
            body = {**body, "env": parse_env(sent_env)}  # as the container sees it
            instance = {"id": instance_id, "label": body.get("label"), "actual_status": "loading",
                        "intended_status": "running", "cur_state": "running", "public_ipaddr": "", "ports": {},
                        "dph_total": body.get("price", offer["dph_total"]), "is_bid": "price" in body,
                        "gpu_name": offer["gpu_name"], "image_uuid": body["image"], "image_runtype": body["runtype"],
                        "extra_env": [[k, v] for k, v in body["env"].items()], "onstart": body["onstart"],
                        "image_args": body.get("args", [])}
            self.instances[instance_id] = instance
            self.creates.append(dict(body, offer_id=offer_id, sent_env=sent_env))
            self.bill_start(instance_id, str(body.get("label") or ""))
            self._hidden[instance_id] = self.late_lists
            if self.end_as:
                instance.update(actual_status=self.end_as.pop(0), status_msg="the container could not start")
            elif self.stuck > 0:
                self.stuck -= 1
            else:
                self._start(instance, body)
            if self.fail_after_create > 0:
                self.fail_after_create -= 1
                return 503, {"success": False, "error": "server_error", "msg": "Service Unavailable"}
        return 200, {"success": True, "new_contract": instance_id}

    def _start(self, instance: dict[str, Any], body: dict[str, Any]) -> None:
        """Run the container: TEI's router command line, with the built-in server for the router."""
        assert body["env"]["-p 80:80"] == "1"
        ports: dict[str, list[dict[str, str]]] = {}
        if body["runtype"] == SSH_RUNTYPE:
            assert self.ssh_port is not None, "an SSH launch needs the test sshd: set fake.ssh_port"
            words = shlex.split(body["onstart"])
            assert words[0] == "nohup" and words[-4] == ">" and words[-2:] == ["2>&1", "&"], words
            words = words[1:words.index(">")]
            wait: list[str] = []
            if words[:2] == ["sh", "-c"]:  # the router waits for the seed: sh -c <script> seed-wait <marker> <s>
                assert words[3] == "seed-wait", words
                wait, words = words[:6], words[6:]
            assert words[0] == "timeout", words
            command = words[1:]
            at = command.index("--huggingface-hub-cache")
            model_dir = command.pop(at + 1)
            command.pop(at)
            ports["22/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(self.ssh_port)}]
            port = free_port()
            if wait:
                waiter = subprocess.Popen([*wait, "true"], stdin=subprocess.DEVNULL, start_new_session=True)
                self.processes[instance["id"]] = waiter  # destroying the instance kills the wait
                after = (instance, waiter, int(wait[5]), command, model_dir, port, body)
                threading.Thread(target=self._after_wait, args=after, daemon=True).start()
            else:
                self._start_router(instance, command, model_dir, port, body, waited_s=None)
        else:
            assert body["runtype"] == "args" and body["onstart"] == "timeout", body
            port = self.run_router(instance["id"], instance["label"], list(body["args"]), body["env"]["API_KEY"])
        ports["80/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(port)}, {"HostIp": "::", "HostPort": str(port)}]
        instance.update(actual_status="running", public_ipaddr="127.0.0.1", ports=ports)

    def _after_wait(self, instance: dict[str, Any], waiter: subprocess.Popen[bytes], wait_s: int,
                    command: list[str], model_dir: str, port: int, body: dict[str, Any]) -> None:
        """Start the router once the seed wait ends, unless the instance was stopped or destroyed meanwhile."""
        began = time.monotonic()
        try:
            waiter.wait(timeout=wait_s + 10)  # the script's own bound, and some
        except subprocess.TimeoutExpired:
            waiter.kill()
            waiter.wait()
        with self.lock:
            if (self.closed or waiter.returncode != 0 or instance["actual_status"] != "running"
                    or instance["cur_state"] == "unloaded"):
                return
            self._start_router(instance, command, model_dir, port, body, waited_s=time.monotonic() - began)

    def _start_router(self, instance: dict[str, Any], command: list[str], model_dir: str, port: int,
                      body: dict[str, Any], *, waited_s: float | None) -> None:
        model = command[command.index("--model-id") + 1]
        # what TEI downloads into its hub cache on first start, when the files are not there
        downloaded = hub_files(model_dir, model)
        self.starts[instance["id"]] = {"downloaded": downloaded, "waited_s": waited_s}
        self.run_router(instance["id"], instance["label"], command, body["env"]["API_KEY"], port=port)

    def stop(self) -> None:
        with self.lock:
            self.closed = True  # a seed wait that ends now starts no router
        super().stop()

    def _list(self, match: re.Match[str], body: Any, query: dict[str, list[str]]) -> tuple[int, Any]:
        limit = min(int(query.get("limit", ["25"])[0]), 25, self.page_size)
        after = int(query["after_token"][0]) if "after_token" in query else 0
        filters = json.loads(query.get("select_filters", ["{}"])[0])
        assert set(filters) <= {"id", "label"} and all(set(f) == {"eq"} for f in filters.values()), filters
        with self.lock:
            if self.show_errors > 0 and "id" in filters:  # a look at one instance (a poll) fails
                self.show_errors -= 1
                return 502, {"success": False, "error": "server_error", "msg": "Bad Gateway"}
            listed = []
            for instance_id, row in self.instances.items():
                if any(row.get(key) != f["eq"] for key, f in filters.items()):
                    continue
                if self._hidden.get(instance_id, 0) > 0:
                    self._hidden[instance_id] -= 1  # not visible in lists yet
                elif row["cur_state"] != "unloaded":
                    listed.append(dict(row))
        page = [row for row in listed if row["id"] > after][:limit]
        more = page and any(row["id"] > page[-1]["id"] for row in listed)
        return 200, {"success": True, "instances": page, "instances_found": len(page), "total_instances": len(listed),
                     "next_token": str(page[-1]["id"]) if more else None}

    def _gone(self, instance_id: int) -> tuple[int, Any] | None:
        instance = self.instances.get(instance_id)
        if instance is None or instance["cur_state"] == "unloaded":
            return 404, {"success": False, "error": "not_found", "msg": "Instance not found"}
        return None

    def _attach(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        assert set(body) == {"ssh_key"}, body
        with self.lock:
            gone = self._gone(int(match["id"]))
            if gone:
                return gone
            self.ssh_keys[int(match["id"])] = body["ssh_key"]
        return 200, {"success": True}

    def _destroy(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        instance_id = int(match["id"])
        with self.lock:
            if self.destroy_errors > 0:
                self.destroy_errors -= 1
                return 503, {"success": False, "error": "server_error", "msg": "Service Unavailable"}
            gone = self._gone(instance_id)
            if gone:
                return gone
            self.instances[instance_id].update(cur_state="unloaded", actual_status="exited", intended_status="stopped")
            self.destroys.append(instance_id)
            self.bill_stop(instance_id)
        self.kill(instance_id)
        return 200, {"success": True}
