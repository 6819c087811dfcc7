"""The webhook's CA and serving certificate (gpudra.controller.certs): what is issued, how a chain
verifies, and when and how stored material is renewed, aged by moving `now`."""

from __future__ import annotations

import base64
import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.controller.certs import (
    CA_LIFETIME,
    SERVING_LIFETIME,
    Change,
    Material,
    Validity,
    chain_problem,
    from_secret_data,
    issue_ca,
    issue_serving,
    names_of,
    read_certificates,
    read_key,
    renewal_due,
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


# --- a stepped clock: validity judged against now alone ---------------------------------------------


def validity(start_days: float, lifetime: timedelta) -> Validity:
    start = NOW + timedelta(days=start_days)
    return Validity(start, start + lifetime)


@settings(max_examples=300, deadline=None)
@given(
    ca_start=st.floats(min_value=-4000, max_value=4000),
    serving_start=st.floats(min_value=-4000, max_value=4000),
    offset=st.floats(min_value=-8000, max_value=8000),
)
def test_renewal_is_due_whenever_a_period_does_not_cover_now_whichever_side_now_lies(
    ca_start: float, serving_start: float, offset: float
) -> None:
    """Clock offsets both ways: material that needs no change is valid now, and one whose period has
    not started yet is renewed exactly like one that ended (the bug was to count it as 'more than its
    whole life left')."""
    ca, serving = validity(ca_start, CA_LIFETIME), validity(serving_start, SERVING_LIFETIME)
    now = NOW + timedelta(days=offset)
    due = renewal_due(now, ca, serving)
    if due is None:
        assert ca.covers(now) and serving.covers(now)
        assert ca.share_left(now) >= 1 / 5 and serving.share_left(now) >= 1 / 3
    if not ca.covers(now):
        assert due is not None and due[0] is Change.EVERYTHING
        assert "is not valid before" in due[1] if now < ca.start else "expired at" in due[1]
    elif not serving.covers(now) and ca.share_left(now) >= 1 / 5:
        assert due is not None and due[0] is Change.SERVING
        assert due[1].startswith("the serving certificate")
    assert renewal_due(now, ca) == (due if due is None or due[0] is not Change.SERVING else None)


def test_a_certificate_issued_by_a_clock_250_days_ahead_is_renewed_once_the_clock_is_right() -> None:
    """The reported case: the leader's clock stepped 250 days ahead reissued the serving certificate
    (a third of its life was left by that clock) with a start in the future; back at the right time it
    must be renewed, not kept as 'more than its whole life left'."""
    material = fresh()
    ahead = NOW + timedelta(days=250)
    assert renewal_reason(ahead, material, NAMES) is not None
    from_the_future = renewed(ahead, material, NAMES)
    assert renewal_reason(ahead, from_the_future, NAMES) is None
    assert chain_problem(NOW, from_the_future.ca_crt, from_the_future, NAMES) is not None

    reason = renewal_reason(NOW, from_the_future, NAMES)
    assert reason == (
        "the serving certificate is not valid before 2026-11-06T11:55:00Z, later than now "
        "(2026-03-01T12:00:00Z): new serving certificate"
    )
    healed = renewed(NOW, from_the_future, NAMES)
    assert healed.ca_crt == material.ca_crt  # the CA was valid all along: trust is kept
    assert renewal_reason(NOW, healed, NAMES) is None
    verify(healed, NOW, NAMES[0])


@settings(max_examples=40, deadline=None)
@given(
    step=st.sampled_from([1, -1]).flatmap(
        lambda sign: st.integers(min_value=1, max_value=4200).map(lambda days: sign * days)
    ),
    age=st.integers(min_value=0, max_value=3000),
)
def test_after_any_clock_step_and_its_correction_one_round_of_renewal_gives_a_chain_valid_now(
    step: int, age: int
) -> None:
    """Material made `age` days ago (its serving certificate kept renewed); the leader's clock steps
    `step` days (ahead or back) and renews until nothing is due by that clock; then the clock is put
    right. One round of renewal (at most three changes, what one keeper step can meet over a few
    steps) gives material a client accepts now."""
    made = NOW - timedelta(days=age)
    material = renewed(made, None, NAMES)
    material = _settled(NOW - timedelta(days=1), material)  # kept current until yesterday
    wrong = NOW + timedelta(days=step)
    material = _settled(wrong, material)
    assert renewal_reason(wrong, material, NAMES) is None
    material = _settled(NOW, material)
    assert renewal_reason(NOW, material, NAMES) is None
    assert chain_problem(NOW, material.ca_crt, material, NAMES) is None
    verify(material, NOW, NAMES[0])


def _settled(now: datetime, material: Material) -> Material:
    for _ in range(3):
        if renewal_reason(now, material, NAMES) is None:
            break
        material = renewed(now, material, NAMES)
    return material


def test_a_chain_a_client_refuses_is_replaced_even_when_each_check_passes() -> None:
    """A serving certificate the CA signed, for the right names, valid now, but not for TLS servers:
    only the path validation finds it; nothing it holds is trusted, so everything is replaced."""
    material = fresh()
    ca, ca_key = read_certificates(material.ca_crt)[0], read_key(material.ca_key)
    serving, key = read_certificates(material.tls_crt)[0], read_key(material.tls_key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(serving.subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(serving.not_valid_before_utc)
        .not_valid_after(serving.not_valid_after_utc)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAMES[0])]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    client_only = builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    stored = Material(client_only, material.tls_key, material.ca_crt, material.ca_key)
    assert trusts(stored.ca_crt, stored)  # signed by the CA: the signature alone says nothing wrong
    reason = renewal_reason(NOW, stored, NAMES)
    assert reason is not None
    assert reason.startswith("the serving certificate does not verify: a client that trusts ca.crt refuses")
    assert reason.endswith(": new CA and serving certificate")
    again = renewed(NOW, stored, NAMES)
    assert renewal_reason(NOW, again, NAMES) is None
    verify(again, NOW, NAMES[0])


def test_chain_problem_names_the_name_and_the_time() -> None:
    material = fresh(names=["a.svc", "10.0.0.1"])
    assert chain_problem(NOW, material.ca_crt, material, ["a.svc", "10.0.0.1"]) is None
    problem = chain_problem(NOW, material.ca_crt, material, ["b.svc"])
    assert problem is not None and problem.startswith("a client that trusts ca.crt refuses it for b.svc at")
    later = NOW + SERVING_LIFETIME + timedelta(days=1)
    problem = chain_problem(later, material.ca_crt, material, ["a.svc"])
    assert problem is not None and "not valid at validation time" in problem
    assert chain_problem(NOW, fresh().ca_crt, material, ["a.svc"]) is not None  # another CA
    assert (chain_problem(NOW, b"", material, ["a.svc"]) or "").startswith("is not a PEM certificate bundle")
