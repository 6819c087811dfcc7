"""Writes the software bill of materials of an image's root filesystem as CycloneDX 1.5 JSON, from the
metadata the installers left in it (`make release`, once per architecture): every Python distribution
in the image's virtual environment (its *.dist-info/METADATA, as pip wrote it) and every Debian package
(/var/lib/dpkg/status). Each component carries its package URL (pkg:pypi, pkg:deb) and its license
where the metadata states one.

Usage: python scripts/sbom.py ROOT --name gpudra --version 0.2.0 --arch arm64 [-o FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

SITE_PACKAGES = "opt/gpudra/lib/python3.11/site-packages"
DPKG_STATUS = "var/lib/dpkg/status"


def python_components(root: Path) -> list[dict[str, Any]]:
    components = []
    for metadata in sorted((root / SITE_PACKAGES).glob("*.dist-info/METADATA")):
        headers = HeaderParser().parsestr(metadata.read_text(encoding="utf-8", errors="replace"))
        name, version = headers["Name"], headers["Version"]
        if not name or not version:
            continue
        component: dict[str, Any] = {
            "type": "library",
            "name": name,
            "version": version,
            "purl": f"pkg:pypi/{name.lower().replace('_', '-')}@{version}",
            "bom-ref": f"pkg:pypi/{name.lower().replace('_', '-')}@{version}",
        }
        # License-Expression (PEP 639) is SPDX; the older License field is free text.
        if headers["License-Expression"]:
            component["licenses"] = [{"expression": headers["License-Expression"]}]
        elif headers["License"] and len(headers["License"]) <= 100:
            component["licenses"] = [{"license": {"name": headers["License"]}}]
        components.append(component)
    return components


def debian_components(root: Path, arch: str) -> list[dict[str, Any]]:
    status = root / DPKG_STATUS
    if not status.is_file():
        return []
    components = []
    for stanza in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" ")
        )
        if "install ok installed" not in fields.get("Status", ""):
            continue
        name, version = fields["Package"], fields["Version"]
        package_arch = fields.get("Architecture", arch)
        purl = f"pkg:deb/debian/{name}@{version}?arch={package_arch}&distro=debian-12"
        components.append(
            {"type": "library", "name": name, "version": version, "purl": purl, "bom-ref": purl}
        )
    return sorted(components, key=lambda c: str(c["name"]))


def sbom(root: Path, *, name: str, version: str, arch: str) -> dict[str, Any]:
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "name": name,
                "version": version,
                "bom-ref": f"{name}@{version}",
                "properties": [{"name": "platform", "value": f"linux/{arch}"}],
            },
            "tools": {"components": [{"type": "application", "name": "gpudra scripts/sbom.py"}]},
        },
        "components": python_components(root) + debian_components(root, arch),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--arch", required=True, choices=["amd64", "arm64"])
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args(argv)
    if not (args.root / SITE_PACKAGES).is_dir():
        print(f"sbom: {args.root} has no {SITE_PACKAGES} (not a gpudra image)", file=sys.stderr)
        return 2
    document = sbom(args.root, name=args.name, version=args.version, arch=args.arch)
    text = json.dumps(document, indent=2) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
