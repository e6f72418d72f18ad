"""The one record the fleet hands to the TEI client: where a server is and how to authenticate."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    """A TEI server's base URL and its API key; the key never appears in ``repr`` or ``str``."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    payload_limit: int | None = None

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        key = "***" if self.api_key else None
        return f"Endpoint(url={self.url!r}, api_key={key!r}, payload_limit={self.payload_limit!r})"
