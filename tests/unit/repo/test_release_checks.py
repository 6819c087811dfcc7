"""The release's checks on an image's files (scripts/elf_arch.py, scripts/sbom.py), on made-up trees."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ELF = _script("elf_arch")
SBOM = _script("sbom")


def _elf(machine: int) -> bytes:
    """An ELF64 little-endian header: magic, class, data, version, padding, e_type, e_machine."""
    return b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HH", 3, machine) + bytes(44)


def test_every_elf_of_the_machine_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "libc.so.6").write_bytes(_elf(183))
    (tmp_path / "python3").write_bytes(_elf(183))
    (tmp_path / "script.py").write_text("print('not an ELF')\n")
    (tmp_path / "short").write_bytes(b"\x7fEL")
    assert ELF.main([str(tmp_path), "--machine", "aarch64"]) == 0
    assert "all 2 ELF files" in capsys.readouterr().out


def test_one_foreign_elf_fails_and_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ok.so").write_bytes(_elf(183))
    (tmp_path / "_cffi_backend.so").write_bytes(_elf(62))
    assert ELF.main([str(tmp_path), "--machine", "aarch64"]) == 1
    err = capsys.readouterr().err
    assert "1 ELF files are not aarch64 (1 aarch64, 1 x86-64)" in err
    assert "_cffi_backend.so: x86-64" in err


def test_links_are_not_followed_out_of_the_tree(tmp_path: Path) -> None:
    (tmp_path / "ok.so").write_bytes(_elf(183))
    (tmp_path / "host-python").symlink_to("/proc/self/exe")
    assert ELF.main([str(tmp_path), "--machine", "aarch64"]) == 0


def test_a_tree_without_elf_files_fails(tmp_path: Path) -> None:
    assert ELF.main([str(tmp_path), "--machine", "aarch64"]) == 1


def test_the_sbom_lists_python_and_debian_packages(tmp_path: Path) -> None:
    site = tmp_path / SBOM.SITE_PACKAGES
    for name, version, license_line in (
        ("grpcio", "1.85.1", "License-Expression: Apache-2.0"),
        ("pydantic_core", "2.41.5", "License: MIT"),
    ):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{license_line}\n"
        )
    dpkg = tmp_path / SBOM.DPKG_STATUS
    dpkg.parent.mkdir(parents=True)
    dpkg.write_text(
        "Package: python3.11\nStatus: install ok installed\nArchitecture: arm64\nVersion: 3.11.2-6\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nArchitecture: arm64\nVersion: 1\n"
    )
    out = tmp_path / "sbom.json"
    assert (
        SBOM.main(
            [str(tmp_path), "--name", "gpudra", "--version", "0.1.0", "--arch", "arm64", "-o", str(out)]
        )
        == 0
    )
    document = json.loads(out.read_text())
    assert document["bomFormat"] == "CycloneDX"
    assert document["metadata"]["component"]["properties"] == [{"name": "platform", "value": "linux/arm64"}]
    by_purl = {c["purl"]: c for c in document["components"]}
    assert by_purl["pkg:pypi/grpcio@1.85.1"]["licenses"] == [{"expression": "Apache-2.0"}]
    assert by_purl["pkg:pypi/pydantic-core@2.41.5"]["licenses"] == [{"license": {"name": "MIT"}}]
    assert "pkg:deb/debian/python3.11@3.11.2-6?arch=arm64&distro=debian-12" in by_purl
    assert len(by_purl) == 3


def test_the_sbom_refuses_a_tree_that_is_no_gpudra_image(tmp_path: Path) -> None:
    assert SBOM.main([str(tmp_path), "--name", "gpudra", "--version", "0.1.0", "--arch", "amd64"]) == 2
