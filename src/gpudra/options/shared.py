"""The options both daemons have, declared once for both: the driver's name and the logs. Pure."""

from __future__ import annotations

from typing import Any, Literal

from gpudra.options.declared import option
from gpudra.options.types import Choice, Pattern

DRIVER = "gpu.gpudra.io"

# A DNS subdomain, as Kubernetes names drivers (the length is checked apart).
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DRIVER_NAME = Pattern(
    _DNS_SUBDOMAIN, "a DNS subdomain: lower-case letters, digits, '-' and '.', at most 63", max_length=63
)
# What gpudra.runtime.logs.configure takes.
LogFormat = Literal["text", "json"]
LOG_LEVELS = Choice(("DEBUG", "INFO", "WARNING", "ERROR"), case_insensitive=True)


def driver_option(help: str = "DRA driver name") -> Any:
    return option(help, type=DRIVER_NAME, default=DRIVER, flag="driver-name", chart="driverName")


def log_format_option() -> Any:
    return option("text or json", type=Choice(("text", "json")), default="text")


def log_level_option() -> Any:
    return option("DEBUG, INFO, WARNING, ERROR", type=LOG_LEVELS, default="INFO")
