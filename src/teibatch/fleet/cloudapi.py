"""The HTTP boundary of the GPU clouds: one small JSON client, the clouds' credentials, error mapping.

Every cloud module (:mod:`~teibatch.fleet.providers.lambdacloud`, :mod:`~teibatch.fleet.providers.runpod`,
:mod:`~teibatch.fleet.providers.vast`) talks to its API through :class:`ApiClient`; this is the one place where
httpx errors and a cloud's error answers become teibatch errors:

* no answer within the timeout → :class:`~teibatch.errors.FleetTimeout` (``what`` names the call; a
  create call that timed out may still have made its instance: callers look it up by name)
* what the cloud's ``classify`` calls "no capacity" / "offer gone" → :class:`~teibatch.errors.CapacityUnavailable`
* 404 and 410 → ``None`` where the caller allows it (an instance already gone counts as destroyed)
* anything else → :class:`~teibatch.errors.CloudApiError` with the HTTP status and the cloud's own
  message (``retryable`` for 429 and 5xx: a create call so answered may still have made its instance)

The API key goes in the ``Authorization`` header only; it is in no message, log line or ``repr``.
Keys come from the environment or the cloud's usual config file, never from the job file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from teibatch.errors import CloudApiError, FleetError, FleetTimeout, JobSpecError

DEFAULT_API_TIMEOUT_S = 30.0
MESSAGE_LIMIT = 300

#: classify(status, body) → the error type for a failed answer (CapacityUnavailable, or FleetError for
#: "not a capacity problem": raised as CloudApiError)
Classifier = Callable[[int, Any], type[FleetError]]


def read_api_key(cloud: str, env: str, files: Sequence[tuple[Path, Callable[[str], str | None]]]) -> str:
    """The API key of ``cloud``: ``$env``, else the first of ``files`` whose parser finds one.

    Raises :class:`JobSpecError` (nothing is rented) naming the variable and the files looked at.
    """
    value = os.environ.get(env, "").strip()
    if value:
        return value
    for path, parse in files:
        try:
            text = path.expanduser().read_text(encoding="utf-8")
        except OSError:
            continue
        found = parse(text)
        if found:
            return found
    where = " or ".join(str(path) for path, _ in files)
    raise JobSpecError(f"no {cloud} API key: set {env}, or put the key in {where}", key="servers.provider")


def key_value(name: str) -> Callable[[str], str | None]:
    """A parser for ``name = value`` lines (quotes optional), as INI- and TOML-style key files hold them."""
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=\s*[\"']?([^\"'\s#]+)", re.MULTILINE)

    def parse(text: str) -> str | None:
        match = pattern.search(text)
        return match.group(1) if match else None

    return parse


def api_url(env: str, default: str) -> str:
    """The API base URL: ``$env`` when set (for tests and proxies), else the cloud's own."""
    return (os.environ.get(env) or default).rstrip("/")


class ApiClient:
    """A JSON API with bearer authentication; closed means closed (use it as a context manager)."""

    def __init__(self, cloud: str, base_url: str, api_key: str, *, classify: Classifier,
                 timeout: float = DEFAULT_API_TIMEOUT_S) -> None:
        self.cloud = cloud
        self.base_url = base_url
        self._classify = classify
        self._http = httpx.Client(base_url=base_url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"})

    def __repr__(self) -> str:
        return f"ApiClient(cloud={self.cloud!r}, base_url={self.base_url!r}, api_key='***')"

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, *, what: str, json: Any = None, missing_ok: bool = False) -> Any:
        """Send one request and return its decoded JSON body (``None`` for a 404 or 410 when ``missing_ok``)."""
        try:
            response = self._http.request(method, path, json=json)
        except httpx.TimeoutException:
            seconds = self._http.timeout.read or 0.0
            raise FleetTimeout(f"{self.cloud}: {what}: no answer within {seconds:.0f}s", what=what,
                               seconds=seconds) from None
        except httpx.HTTPError as exc:
            raise FleetError(f"{self.cloud}: {what}: cannot reach {self.base_url}: {type(exc).__name__}") from None
        body: Any
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text[:MESSAGE_LIMIT]
        status = response.status_code
        if status in (404, 410) and missing_ok:
            return None
        if status >= 400:
            error = self._classify(status, body)
            if error is not FleetError:
                raise error(f"{self.cloud}: {what}: {status} {message_of(body)}")
            if status in (401, 403):
                raise CloudApiError(f"{self.cloud}: {what}: the API refused the API key ({status}); "
                                    "check the key in the environment or the config file", status_code=status)
            raise CloudApiError(f"{self.cloud}: {what}: {status} {message_of(body)}", status_code=status)
        return body


def message_of(body: Any) -> str:
    """A short, single-line message from an error body (``{"error": {"message": ...}}`` and the like;
    Vast's ``{"error": <code>, "msg": <text>}`` gives both)."""
    if isinstance(body, Mapping) and isinstance(body.get("msg"), str):
        code = body.get("error")
        body = f"{code}: {body['msg']}" if isinstance(code, str) and code else body["msg"]
    if isinstance(body, Mapping):
        inner = body.get("error", body.get("errors", body.get("message", body)))
        if isinstance(inner, list) and inner:
            inner = inner[0]
        if isinstance(inner, Mapping):
            inner = inner.get("message") or inner.get("code") or inner
        body = inner
    text = " ".join(str(body).split())
    return text[:MESSAGE_LIMIT]

