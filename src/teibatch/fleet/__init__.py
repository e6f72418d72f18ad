"""Fleets of TEI servers: providers that launch or adopt servers and take them down again."""

from teibatch.fleet.base import Provider, running, wait_healthy
from teibatch.fleet.local import LocalProvider
from teibatch.fleet.static import StaticProvider

__all__ = ["LocalProvider", "Provider", "StaticProvider", "running", "wait_healthy"]
