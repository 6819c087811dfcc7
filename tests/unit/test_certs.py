"""The webhook's CA and serving certificate (gpudra.controller.certs): what is issued, how a chain
verifies, and when and how stored material is renewed, aged by moving `now`."""

from __future__ import annotations

import base64
import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.x509 import verification
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.controller.certs import (
    CA_LIFETIME,
    SERVING_LIFETIME,
    Material,
    from_secret_data,
    issue_ca,
    issue_serving,
    names_of,
    read_certificates,
    read_key,
    renewal_reason,
    renewed,
    to_secret_data,
    trusts,
)
from gpudra.errors import ConfigError

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NAMES = ["gpudra-webhook.gpudra.svc"]


def fresh(now: datetime = NOW, names: list[str] = NAMES) -> Material:
    return renewed(now, None, names)


def verify(material: Material, at: datetime, name: str) -> None:
    """A full path validation as a TLS client makes it: `name` against the serving certificate,
    chained to a CA of the bundle, valid at `at`. Raises VerificationError."""
    store = verification.Store(read_certificates(material.ca_crt))
    subject: verification.Subject
    try:
        subject = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    verifier = verification.PolicyBuilder().store(store).time(at).build_server_verifier(subject)
    verifier.verify(read_certificates(material.tls_crt)[0], [])


def test_a_fresh_chain_verifies_for_its_names_and_only_them() -> None:
    material = fresh(names=["gpudra-webhook.gpudra.svc", "127.0.0.1", "::1"])
    for name in ("gpudra-webhook.gpudra.svc", "127.0.0.1", "::1"):
        verify(material, NOW, name)
    with pytest.raises(verification.VerificationError):
        verify(material, NOW, "other.gpudra.svc")
    with pytest.raises(verification.VerificationError):
        verify(material, NOW + SERVING_LIFETIME + timedelta(days=1), "127.0.0.1")
    serving = read_certificates(material.tls_crt)[0]
    assert names_of(serving) == {"gpudra-webhook.gpudra.svc", "127.0.0.1", "::1"}
    assert serving.not_valid_after_utc == NOW + SERVING_LIFETIME
    assert read_certificates(material.ca_crt)[0].not_valid_after_utc == NOW + CA_LIFETIME
    assert trusts(material.ca_crt, material)
    assert not trusts(fresh().ca_crt, material)  # another CA


def test_the_ca_can_sign_but_the_serving_certificate_cannot() -> None:
    ca = issue_ca(NOW)
    serving = issue_serving(NOW, ca, NAMES)
    ca_cert, serving_cert = read_certificates(ca.cert)[0], read_certificates(serving.cert)[0]
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca_cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert not serving_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    serving_cert.verify_directly_issued_by(ca_cert)
    assert read_key(serving.key).public_key() == serving_cert.public_key()
    assert ca_cert.not_valid_before_utc < NOW  # backdated for clocks a little behind


def test_issuing_needs_a_name() -> None:
    with pytest.raises(ConfigError, match="names: needs at least one DNS name or IP address"):
        issue_serving(NOW, issue_ca(NOW), [])


def test_reading_damaged_pem_names_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match="is not a PEM certificate bundle"):
        read_certificates(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="is not a PEM certificate bundle"):
        read_certificates(b"")
    with pytest.raises(ConfigError, match="is not an unencrypted PEM private key"):
        read_key(b"junk")


def test_secret_data_round_trips_and_damage_reads_as_empty() -> None:
    material = fresh()
    data = to_secret_data(material)
    assert sorted(data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert base64.b64decode(data["tls.crt"]) == material.tls_crt
    assert from_secret_data(data) == material
    damaged = from_secret_data({**data, "tls.crt": "not base64!", "tls.key": 7})
    assert damaged.tls_crt == damaged.tls_key == b""
    assert damaged.ca_crt == material.ca_crt
    assert from_secret_data(None) == Material(b"", b"", b"", b"")


def test_good_material_needs_nothing_and_renewed_returns_it() -> None:
    material = fresh()
    assert renewal_reason(NOW + timedelta(days=200), material, NAMES) is None
    assert renewed(NOW + timedelta(days=200), material, NAMES) is material
    # names are compared as sets, DNS names without regard to case
    assert renewal_reason(NOW, fresh(names=["a.svc", "10.0.0.1"]), ["10.0.0.1", "A.svc"]) is None


def test_missing_or_unusable_ca_replaces_everything() -> None:
    material = fresh()
    cases = {
        "no TLS material stored": None,
        "ca.crt or ca.key is missing or unreadable": Material(material.tls_crt, material.tls_key, b"", b""),
        "ca.key does not belong to the first certificate of ca.crt": Material(
            material.tls_crt, material.tls_key, material.ca_crt, fresh().ca_key
        ),
    }
    for expected, stored in cases.items():
        reason = renewal_reason(NOW, stored, NAMES)
        assert reason is not None and reason.startswith(expected), reason
        assert reason.endswith(": new CA and serving certificate")
        again = renewed(NOW, stored, NAMES)
        assert renewal_reason(NOW, again, NAMES) is None
        if stored is not None:
            assert again.ca_crt != stored.ca_crt
        verify(again, NOW, NAMES[0])


def test_serving_certificate_problems_reissue_it_from_the_same_ca() -> None:
    material, other = fresh(), fresh()
    cases = {
        "tls.crt or tls.key is missing or unreadable": Material(b"", b"", material.ca_crt, material.ca_key),
        "tls.key does not belong to tls.crt": Material(
            material.tls_crt, other.tls_key, material.ca_crt, material.ca_key
        ),
        "the serving certificate is not signed by the current CA": Material(
            other.tls_crt, other.tls_key, material.ca_crt, material.ca_key
        ),
    }
    for expected, stored in cases.items():
        reason = renewal_reason(NOW, stored, NAMES)
        assert reason is not None and reason.startswith(expected), reason
        assert reason.endswith(": new serving certificate")
        again = renewed(NOW, stored, NAMES)
        assert (again.ca_crt, again.ca_key) == (material.ca_crt, material.ca_key)
        assert renewal_reason(NOW, again, NAMES) is None


def test_other_names_reissue_the_serving_certificate() -> None:
    material = fresh()
    wanted = ["gpudra-webhook.other.svc"]
    assert renewal_reason(NOW, material, wanted) == (
        "the serving certificate is for gpudra-webhook.gpudra.svc; the webhook is reached as "
        "gpudra-webhook.other.svc: new serving certificate"
    )
    again = renewed(NOW, material, wanted)
    assert names_of(read_certificates(again.tls_crt)[0]) == {"gpudra-webhook.other.svc"}
    assert again.ca_crt == material.ca_crt


def test_the_serving_certificate_is_renewed_with_a_third_of_its_life_left() -> None:
    material = fresh()
    life = SERVING_LIFETIME + timedelta(minutes=5)  # backdated
    at_two_thirds = NOW - timedelta(minutes=5) + life * 2 / 3
    assert renewal_reason(at_two_thirds - timedelta(hours=1), material, NAMES) is None
    later = at_two_thirds + timedelta(hours=1)
    reason = renewal_reason(later, material, NAMES)
    assert reason is not None and reason.startswith("the serving certificate expires at")
    again = renewed(later, material, NAMES)
    assert again.ca_crt == material.ca_crt
    assert read_certificates(again.tls_crt)[0].not_valid_after_utc == later + SERVING_LIFETIME


def test_ca_rollover_keeps_the_old_ca_trusted_until_it_expires() -> None:
    material = fresh()
    old_ca = read_certificates(material.ca_crt)[0]
    # the serving certificate is renewed on its own before; give it a fresh one at the CA's 4/5
    at = NOW + CA_LIFETIME * 4 / 5 + timedelta(days=1)
    before = renewed(at - timedelta(days=2), material, NAMES)
    before = renewed(at - timedelta(days=2), before, NAMES)
    assert renewal_reason(at - timedelta(days=2), before, NAMES) is None

    reason = renewal_reason(at, before, NAMES)
    assert reason is not None and reason.endswith("new CA beside the old one")
    phase_a = renewed(at, before, NAMES)
    bundle = read_certificates(phase_a.ca_crt)
    assert len(bundle) == 2 and bundle[1] == old_ca
    assert phase_a.tls_crt == before.tls_crt  # still served, still trusted through the old CA
    verify(phase_a, at, NAMES[0])

    assert renewal_reason(at, phase_a, NAMES) == (
        "the serving certificate is not signed by the current CA: new serving certificate"
    )
    phase_b = renewed(at, phase_a, NAMES)
    assert phase_b.ca_crt == phase_a.ca_crt
    read_certificates(phase_b.tls_crt)[0].verify_directly_issued_by(bundle[0])
    assert trusts(phase_a.ca_crt, phase_b) and trusts(phase_a.ca_crt, phase_a)
    assert renewal_reason(at, phase_b, NAMES) is None

    after_expiry = old_ca.not_valid_after_utc + timedelta(seconds=1)
    # by then the serving certificate has been renewed in its own time
    current = renewed(after_expiry - timedelta(days=1), phase_b, NAMES)
    assert (
        renewal_reason(after_expiry, current, NAMES)
        == "1 old CA(s) in ca.crt expired: expired CAs out of the bundle"
    )
    pruned = renewed(after_expiry, current, NAMES)
    assert read_certificates(pruned.ca_crt) == [bundle[0]]
    assert pruned.tls_crt == current.tls_crt
    assert renewal_reason(after_expiry, pruned, NAMES) is None


def test_an_expired_ca_is_replaced_with_everything() -> None:
    material = fresh()
    later = NOW + CA_LIFETIME + timedelta(days=1)
    reason = renewal_reason(later, material, NAMES)
    assert reason is not None and reason.startswith("the CA expired at")
    assert reason.endswith("new CA and serving certificate")
    again = renewed(later, material, NAMES)
    verify(again, later, NAMES[0])
    assert len(read_certificates(again.ca_crt)) == 1


@settings(max_examples=40, deadline=None)
@given(
    ca_age=st.integers(min_value=0, max_value=3700),
    serving_age=st.integers(min_value=0, max_value=400),
    names=st.lists(st.sampled_from(["a.ns.svc", "b.ns.svc", "10.1.2.3", "::1"]), min_size=1, unique=True),
)
def test_renewal_reaches_good_material_in_at_most_three_changes(
    ca_age: int, serving_age: int, names: list[str]
) -> None:
    """Whatever the ages and names, renewing until no reason is left takes at most three changes (new
    CA, serving certificate, pruning never all needed at once), and ends with a chain a client accepts."""
    ca = issue_ca(NOW)
    # the serving certificate was issued while the CA was valid
    issued = NOW + timedelta(days=max(0, min(ca_age, 3600) - serving_age))
    serving = issue_serving(issued, ca, ["a.ns.svc"])
    material = Material(serving.cert, serving.key, ca.cert, ca.key)
    now = NOW + timedelta(days=ca_age)
    for _ in range(3):
        if renewal_reason(now, material, names) is None:
            break
        material = renewed(now, material, names)
    assert renewal_reason(now, material, names) is None
    for name in names:
        verify(material, now, name)
