"""A fake Lambda Cloud API whose instances are real: the test's sshd with stand-in docker and nvidia-smi.

Checked against Lambda Cloud API v1 as its reference (docs-api.lambda.ai/api/cloud) and the
OpenAPI-generated client ``lambda-cloud-client`` (models ``LaunchInstanceRequest``, ``Instance``) show it:

* ``GET /api/v1/instance-types`` → ``{"data": {<name>: {"instance_type": {"name", "description",
  "gpu_description", "price_cents_per_hour", "specs": {"vcpus", "memory_gib", "storage_gib", "gpus"}},
  "regions_with_capacity_available": [{"name", "description"}]}}}``
* ``POST /api/v1/instance-operations/launch`` with ``region_name``, ``instance_type_name``,
  ``ssh_key_names``, ``quantity``, ``name`` → ``{"data": {"instance_ids": [...]}}``; no capacity →
  400 ``{"error": {"code": "instance-operations/launch/insufficient-capacity", "message", "suggestion"}}``
* ``GET /api/v1/instances`` → ``{"data": [Instance...]}``; ``GET /api/v1/instances/{id}`` →
  ``{"data": Instance}`` or 404 ``{"error": {"code": "global/object-does-not-exist", ...}}``.
  Instance: ``id``, ``name``, ``ip``, ``status`` (booting, active, unhealthy, terminating, terminated),
  ``ssh_key_names``, ``file_system_names``, ``region`` {name, description}, ``instance_type`` {...}, ``hostname``
* ``POST /api/v1/instance-operations/terminate`` with ``instance_ids`` →
  ``{"data": {"terminated_instances": [Instance...]}}``
* a wrong key → 401 ``{"error": {"code": "global/invalid-api-key", "message": ...}}``
* over the documented rate limits (about 1 request per second, 1 launch per 10 seconds: :data:`RATES`,
  enforced once a test sets ``intervals``, see :class:`~tests.fleet.fakehttp.FakeApi`) → 429 with
  ``Retry-After`` and ``{"error": {"code": "global/too-many-requests", "message": ...}}`` (the rates are
  Lambda's docs', as SkyPilot's ``sky/provision/lambda_cloud/lambda_utils.py`` quotes them: "~1 request
  every second", launches "~1 request every 10 seconds"; the 429 body and header are not documented:
  SkyPilot reads the status only, and so does teibatch)

Faults: ``no_capacity`` ((type, region) pairs), ``stuck`` (that many launches stay ``booting``),
``slow_launches``/``launch_delay_s`` (the instance is made, the answer comes late: a create timeout),
``late_listing`` (a new instance is left out of that many ``GET /instances`` answers: the list shows it
some polls after the launch, as an eventually consistent API does).
Every instance's ``ip`` is 127.0.0.1 (the sshd); terminating one kills the stand-in containers named like
its server (its name without the ``.<attempt>`` of a second or later create attempt).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from tests.fleet.fakehttp import FakeApi

TYPES = {
    "gpu_1x_a10": {"gpu": "A10 (24 GB PCIe)", "cents": 75, "regions": ["us-east-1", "us-west-1"], "gpus": 1},
    "gpu_1x_a100_sxm4": {"gpu": "A100 (40 GB SXM4)", "cents": 129, "regions": ["us-east-1"], "gpus": 1},
    "gpu_8x_a100": {"gpu": "A100 (40 GB SXM4)", "cents": 1032, "regions": ["us-east-1"], "gpus": 8},
    "gpu_1x_v100": {"gpu": "Tesla V100 (16 GB)", "cents": 50, "regions": ["us-south-1"], "gpus": 1},
    # an Arm machine (Grace Hopper): the cheapest per TFLOPS, and TEI has no image for it
    "gpu_1x_gh200": {"gpu": "GH200 (96 GB)", "cents": 149, "regions": ["us-east-3"], "gpus": 1},
    # a type whose specs carry no GPU count (the name does)
    "gpu_8x_h100_sxm5": {"gpu": "H100 (80 GB SXM5)", "cents": 2392, "regions": ["us-east-1"], "gpus": None},
}


#: Lambda's documented rate limits, as ``FakeApi.intervals``: seconds between requests (every one; launches)
RATES = {"*": 1.0, "_launch": 10.0}


class FakeLambda(FakeApi):
    """Lambda Cloud's instance API; ``creates`` and ``terminates`` record every call that made or ended one."""

    def __init__(self, api_key: str, *, on_terminate: Callable[[str], None] | None = None,
                 types: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(api_key)
        self.types = types or TYPES
        self.instances: dict[str, dict[str, Any]] = {}
        self.creates: list[dict[str, Any]] = []
        self.launch_attempts: list[tuple[str, str]] = []
        self.terminates: list[str] = []
        self.no_capacity: set[tuple[str, str]] = set()
        self.stuck = 0
        self.slow_launches = 0
        self.launch_delay_s = 0.0
        self.late_listing = 0
        self.on_terminate = on_terminate
        base = "/api/v1"
        self.route("GET", f"{base}/instance-types", self._types)
        self.route("POST", f"{base}/instance-operations/launch", self._launch)
        self.route("GET", f"{base}/instances", self._list)
        self.route("GET", f"{base}/instances/(?P<id>[^/]+)", self._get)
        self.route("POST", f"{base}/instance-operations/terminate", self._terminate)

    def unauthorized(self) -> tuple[int, Any]:
        return 401, {"error": {"code": "global/invalid-api-key",
                               "message": "API key was invalid, expired, or deleted."}}

    def too_many(self, retry_after: int) -> tuple[int, Any]:
        return 429, {"error": {"code": "global/too-many-requests",
                               "message": "Too many requests. Please slow down and try again."}}

    def server_error(self) -> tuple[int, Any]:
        return 503, {"error": {"code": "global/service-unavailable", "message": "Service temporarily unavailable."}}

    def alive(self) -> int:
        """Instances not terminated: the count every test ends with (0)."""
        with self.lock:
            return sum(1 for i in self.instances.values() if i["status"] != "terminated")

    def _kind(self, name: str) -> dict[str, Any]:
        spec = self.types[name]
        specs = {"vcpus": 30, "memory_gib": 200, "storage_gib": 1400, "gpus": spec["gpus"]}
        if spec["gpus"] is None:
            del specs["gpus"]
        count = spec["gpus"] or int(name.split("_")[1].rstrip("x"))
        return {"name": name, "description": f"{count}x {spec['gpu']}", "gpu_description": spec["gpu"],
                "price_cents_per_hour": spec["cents"], "specs": specs}

    def _types(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        data = {name: {"instance_type": self._kind(name),
                       "regions_with_capacity_available": [{"name": r, "description": r} for r in spec["regions"]
                                                           if (name, r) not in self.no_capacity]}
                for name, spec in self.types.items()}
        return 200, {"data": data}

    def _launch(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        assert set(body) <= {"region_name", "instance_type_name", "ssh_key_names", "file_system_names", "quantity",
                             "name"}, body
        assert len(body["ssh_key_names"]) == 1, "Lambda: exactly one SSH key must be specified"
        kind, region = body["instance_type_name"], body["region_name"]
        with self.lock:
            self.launch_attempts.append((kind, region))
            if (kind, region) in self.no_capacity or region not in self.types[kind]["regions"]:
                return 400, {"error": {"code": "instance-operations/launch/insufficient-capacity",
                                       "message": "Not enough capacity to fulfill launch request.",
                                       "suggestion": "Choose an instance type with more availability, or try later."}}
            instance_id = secrets.token_hex(16)
            stuck = self.stuck > 0
            self.stuck -= 1 if stuck else 0
            self.instances[instance_id] = {
                "id": instance_id, "name": body.get("name"), "ip": None, "status": "booting", "stuck": stuck,
                "ssh_key_names": body["ssh_key_names"], "file_system_names": [], "hostname": None,
                "region": {"name": region, "description": region}, "instance_type": self._kind(kind),
                "jupyter_token": None, "jupyter_url": None,
                "unlisted": self.late_listing}
            self.creates.append(dict(body))
            self.bill_start(instance_id, str(body.get("name") or ""))
            slow = self.slow_launches > 0
            self.slow_launches -= 1 if slow else 0
        if slow:
            time.sleep(self.launch_delay_s)
        return 200, {"data": {"instance_ids": [instance_id]}}

    def _public(self, instance: dict[str, Any]) -> dict[str, Any]:
        if instance["status"] == "booting" and not instance["stuck"]:
            instance.update(status="active", ip="127.0.0.1", hostname="127-0-0-1.cloud.lambdalabs.com")
        return {k: v for k, v in instance.items() if k not in ("stuck", "unlisted")}

    def _list(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            listed = []
            for instance in self.instances.values():
                if instance["unlisted"] > 0:
                    instance["unlisted"] -= 1
                elif instance["status"] != "terminated":
                    listed.append(self._public(instance))
            return 200, {"data": listed}

    def _get(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            instance = self.instances.get(match["id"])
            if instance is None:
                return 404, {"error": {"code": "global/object-does-not-exist",
                                       "message": "Specified instance does not exist."}}
            return 200, {"data": self._public(instance)}

    def _terminate(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        done = []
        with self.lock:
            for instance_id in body["instance_ids"]:
                instance = self.instances.get(instance_id)
                if instance is None:
                    return 404, {"error": {"code": "global/object-does-not-exist",
                                           "message": "Specified instance does not exist."}}
                if instance["status"] != "terminated":
                    instance["status"] = "terminated"
                    self.bill_stop(instance_id)
                    self.terminates.append(instance_id)
                    if self.on_terminate and instance["name"]:
                        # the VM's containers are named after its server: teibatch-<run>-<n> (no ".<attempt>")
                        self.on_terminate(re.sub(r"\.\d+$", "", instance["name"]))
                done.append(self._public(instance))
        return 200, {"data": {"terminated_instances": done}}
