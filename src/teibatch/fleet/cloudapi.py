"""The HTTP boundary of the GPU clouds: one small JSON client, the clouds' credentials, error mapping.

Every cloud module (:mod:`~teibatch.fleet.providers.lambdacloud`, :mod:`~teibatch.fleet.providers.runpod`,
:mod:`~teibatch.fleet.providers.vast`) talks to its API through :class:`ApiClient`; this is the one place where
httpx errors and a cloud's error answers become teibatch errors:

* no answer within the timeout → :class:`~teibatch.errors.FleetTimeout` (``what`` names the call; a
  create call that timed out may still have made its instance: callers look it up by name)
* what the cloud's ``classify`` calls "no capacity" / "offer gone" → :class:`~teibatch.errors.CapacityUnavailable`
* 404 and 410 → ``None`` where the caller allows it (an instance already gone counts as destroyed)
* 429 (too many requests) → the call is sent again after the wait the cloud asks for (``Retry-After``
  in seconds or as a date, else the ``reset`` of a ``RateLimit`` header, else a growing backoff), for
  at most :attr:`ApiClient.rate_limit_patience_s`; then :class:`~teibatch.errors.RateLimited`. A 429
  is never "no capacity", and never a failed terminate: the cloud did not process the call
* anything else → :class:`~teibatch.errors.CloudApiError` with the HTTP status and the cloud's own
  message (``retryable`` for 5xx: a create call so answered may still have made its instance)

Requests are **paced** from the cloud's documented limits (:class:`Pace`: at most one request per
``interval_s`` for the calls a pace matches, e.g. Lambda's one launch per 10 s), so that a run's
``count`` creates and its polls stay under the limits instead of meeting 429s; the waits are shared
by the threads that use one client. :attr:`ApiClient.pace_scale` scales every pace (tests lower it).

The API key goes in the ``Authorization`` header only; it is in no message, log line or ``repr``.
Keys come from the environment or the cloud's usual config file, never from the job file.
"""

from __future__ import annotations

import email.utils
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

from teibatch.errors import CloudApiError, FleetError, FleetTimeout, JobSpecError, RateLimited

log = logging.getLogger(__name__)

DEFAULT_API_TIMEOUT_S = 30.0
MESSAGE_LIMIT = 300
DEFAULT_RATE_LIMIT_PATIENCE_S = 300.0   # how long one call keeps waiting out 429 answers
FIRST_BACKOFF_S = 1.0                   # the wait after a 429 that names none; doubled each time, up to:
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class Pace:
    """At most one request per ``interval_s`` seconds among those whose method is ``method`` (``*``: any)
    and whose path (after the base URL) matches the regular expression ``path`` from its start."""

    method: str
    path: str
    interval_s: float

    def matches(self, method: str, path: str) -> bool:
        return self.method in ("*", method) and re.match(self.path, path) is not None


def retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The seconds a 429 answer asks to wait: ``Retry-After`` (seconds, or an HTTP date), else the
    ``reset`` of a ``RateLimit`` header (``limit=10, remaining=0, reset=5``, as RunPod sends); ``None``
    when it names none."""
    value = headers.get("retry-after", "").strip()
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value).timestamp()
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when - (time.time() if now is None else now))
    match = re.search(r"(?:^|[,;\s])reset=(\d+(?:\.\d+)?)", headers.get("ratelimit", ""))
    return float(match.group(1)) if match else None

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
    """A JSON API with bearer authentication, paced by ``paces``; closed means closed (use it as a context
    manager). Safe to share between threads."""

    #: every pace's interval is multiplied by this (tests against the fakes lower it)
    pace_scale: ClassVar[float] = 1.0
    #: how long one call keeps waiting out 429 answers before it raises RateLimited
    rate_limit_patience_s: ClassVar[float] = DEFAULT_RATE_LIMIT_PATIENCE_S

    def __init__(self, cloud: str, base_url: str, api_key: str, *, classify: Classifier,
                 timeout: float = DEFAULT_API_TIMEOUT_S, paces: Sequence[Pace] = ()) -> None:
        self.cloud = cloud
        self.base_url = base_url
        self.paces = tuple(paces)
        self._classify = classify
        self._next_at: dict[Pace, float] = {}   # pace → the monotonic time its next request may go
        self._pace_lock = threading.Lock()
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

    def _wait_turn(self, paces: list[Pace]) -> None:
        """Wait until every pace of a request lets it go, and take that turn (threads queue up)."""
        if not paces:
            return
        with self._pace_lock:
            now = time.monotonic()
            at = max([now, *(self._next_at.get(p, now) for p in paces)])
            for pace in paces:
                self._next_at[pace] = at + pace.interval_s * self.pace_scale
        if at > now:
            time.sleep(at - now)

    def _done(self, paces: list[Pace]) -> None:
        """Count the intervals of a request's paces from its answer too: the cloud counts from when the request
        reached it, which is after it was sent."""
        with self._pace_lock:
            now = time.monotonic()
            for pace in paces:
                self._next_at[pace] = max(self._next_at.get(pace, now), now + pace.interval_s * self.pace_scale)

    def call(self, method: str, path: str, *, what: str, json: Any = None, missing_ok: bool = False) -> Any:
        """Send one request and return its decoded JSON body (``None`` for a 404 or 410 when ``missing_ok``).

        Paced; a 429 is sent again after the wait the cloud asks for, until :attr:`rate_limit_patience_s`.
        """
        give_up = time.monotonic() + self.rate_limit_patience_s
        backoff = FIRST_BACKOFF_S
        while True:
            response = self._send(method, path, what=what, json=json)
            if response.status_code != 429:
                return self._decode(response, what=what, missing_ok=missing_ok)
            asked = retry_after(response.headers)
            wait = backoff if asked is None else asked
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            if time.monotonic() + wait > give_up:
                raise RateLimited(f"{self.cloud}: {what}: the API still answers 429 (too many requests) after "
                                  f"{self.rate_limit_patience_s:.0f}s of waiting as it asked; run again later",
                                  retry_after=asked)
            log.info("%s: %s: 429 (too many requests); sending it again in %.1fs", self.cloud, what, wait)
            time.sleep(wait)

    def _send(self, method: str, path: str, *, what: str, json: Any) -> httpx.Response:
        paces = [p for p in self.paces if p.matches(method, path)]
        self._wait_turn(paces)
        try:
            return self._http.request(method, path, json=json)
        except httpx.TimeoutException:
            seconds = self._http.timeout.read or 0.0
            raise FleetTimeout(f"{self.cloud}: {what}: no answer within {seconds:.0f}s", what=what,
                               seconds=seconds) from None
        except httpx.HTTPError as exc:
            raise FleetError(f"{self.cloud}: {what}: cannot reach {self.base_url}: {type(exc).__name__}") from None
        finally:
            self._done(paces)

    def _decode(self, response: httpx.Response, *, what: str, missing_ok: bool) -> Any:
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

