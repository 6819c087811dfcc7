"""The local cluster's API server certificate is made again when it does not name the address in use
(a cluster directory run with the fake CRI, then with containerd: `make cluster-up` either way)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.localcluster.cluster import certificate_names, drop_stale_serving_certificate


def _self_signed(pki: Path, *addresses: str) -> None:
    """A certificate like the API server's own, for `addresses`."""
    pki.mkdir(exist_ok=True)
    names = ",".join(f"IP:{a}" for a in addresses) + ",DNS:localhost"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost",
            "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.crt"),
            "-addext", f"subjectAltName={names}",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip


def test_a_certificate_for_the_address_in_use_is_kept(tmp_path: Path) -> None:
    _self_signed(tmp_path, "127.0.0.1", "10.0.0.1")
    assert certificate_names(tmp_path / "apiserver.crt", "127.0.0.1")
    assert not drop_stale_serving_certificate(tmp_path, "127.0.0.1")
    assert (tmp_path / "apiserver.crt").exists() and (tmp_path / "apiserver.key").exists()


def test_a_certificate_for_other_addresses_is_removed_with_its_key(tmp_path: Path) -> None:
    _self_signed(tmp_path, "127.0.0.1", "10.0.0.1")
    assert not certificate_names(tmp_path / "apiserver.crt", "192.168.7.20")
    assert drop_stale_serving_certificate(tmp_path, "192.168.7.20")
    assert not (tmp_path / "apiserver.crt").exists() and not (tmp_path / "apiserver.key").exists()


def test_a_damaged_certificate_is_removed_and_none_is_nothing_to_do(tmp_path: Path) -> None:
    assert not drop_stale_serving_certificate(tmp_path, "127.0.0.1")
    (tmp_path / "apiserver.crt").write_text("not a certificate\n")
    assert drop_stale_serving_certificate(tmp_path, "127.0.0.1")
    assert not (tmp_path / "apiserver.crt").exists()
