"""Which gpudra this is. The version has one source, pyproject.toml: it is read back from the installed
distribution's metadata, so a wheel, an editable checkout and the image report the same number as the
chart's appVersion. The git revision is the image's where it runs in one: the Dockerfile stores its
REVISION build argument (`make image`, `make release`) in GPUDRA_REVISION; else the one a wheel built
from a checkout carries (setup.py stamps it into gpudra/REVISION); an editable checkout has none
("unknown")."""

from __future__ import annotations

import os
from importlib import metadata, resources

UNKNOWN = "unknown"


def version() -> str:
    try:
        return metadata.version("gpudra")
    except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
        return UNKNOWN


def revision() -> str:
    if from_image := os.environ.get("GPUDRA_REVISION"):
        return from_image
    try:
        stamped = resources.files("gpudra").joinpath("REVISION").read_text().strip()
    except OSError:  # not built from a checkout
        return UNKNOWN
    return stamped or UNKNOWN


def describe() -> str:
    """What `gpudra --version` prints: `gpudra 0.2.0 (revision 1a2b3c4...)`."""
    return f"gpudra {version()} (revision {revision()})"
