"""The webhook's serving certificate for this machine's loopback address, and a client that trusts its CA:
what the webhook's and the /status page's unit tests talk HTTPS with."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime

from gpudra.controller import certs
from gpudra.controller.certs import Material

HERE = ["127.0.0.1"]


def material_for(names: list[str] = HERE, now: datetime | None = None) -> Material:
    return certs.renewed(now or datetime.now(UTC), None, names)


def client_context(material: Material) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=material.ca_crt.decode())
