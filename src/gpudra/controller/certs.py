"""The admission webhook's own certificate authority and serving certificate, and when to renew them.
Pure: certificates are made and judged in memory; the clock is an argument (`now`), so tests age them.

gpudra keeps its webhook's TLS material itself rather than needing cert-manager: a Secret (`Material`,
type kubernetes.io/tls) holds a self-signed CA and a serving certificate it signed, and the CA bundle
the ValidatingWebhookConfiguration gives the API server to trust.

Keys are EC P-256: a key is made in a millisecond where RSA 2048 takes tens (the tests make hundreds),
certificates and handshakes are smaller, and every TLS stack the API server and Python use accepts them.

Renewal (`renewal_reason`, `renewed`) makes one change at a time, so that the API server never has to
trust a certificate it was not told about first:
- a CA with less than a fifth of its life left is replaced, but its successor only joins the bundle:
  `ca.crt` holds the signing CA first, then the older CAs until they expire, and the serving
  certificate (signed by the old CA) stays;
- the serving certificate is reissued by the current CA when it is missing, was signed by another CA
  (which is the second half of a CA change), names other hosts than the webhook's, is not valid now,
  or has less than a third of its life left; the caller makes this change only once the configuration
  trusts that CA;
- expired CAs leave the bundle.
A CA that is missing, unreadable or not valid now is replaced together with the serving certificate:
there is no trust left to keep.

The clock may step either way between two renewals (a leader whose wall clock jumped ahead reissued
the certificates with a start in the future, then the clock was put right). So "valid" always means
"the validity period covers now", judged afresh at every call by `renewal_due`, a function of the two
validity periods and `now` alone: a certificate not valid yet is renewed like an expired one, never
counted as having more than its whole life left. Last, the serving certificate must pass a full path
validation against the bundle at `now` (`chain_problem`, as a TLS client makes it), so that no other
flaw leaves a chain the API server refuses in place.
"""

from __future__ import annotations

import base64
import binascii
import enum
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpudra.errors import ConfigError
from gpudra.model.tolerant import mapping

CA_LIFETIME = timedelta(days=3650)
SERVING_LIFETIME = timedelta(days=365)
# Certificates start this long before they are made: a node whose clock runs a little behind the
# controller's must not see them as not yet valid.
BACKDATE = timedelta(minutes=5)
# Renew when less than this share of a certificate's lifetime is left.
CA_RENEW_AT = 1 / 5
SERVING_RENEW_AT = 1 / 3

SECRET_TYPE = "kubernetes.io/tls"
_KEYS = {"tls_crt": "tls.crt", "tls_key": "tls.key", "ca_crt": "ca.crt", "ca_key": "ca.key"}


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM."""

    cert: bytes
    key: bytes


@dataclass(frozen=True)
class Material:
    """The webhook's Secret, PEM: the serving certificate and key, the CA bundle the API server trusts
    (the signing CA first, then older CAs until they expire), and the signing CA's key."""

    tls_crt: bytes
    tls_key: bytes
    ca_crt: bytes
    ca_key: bytes


def from_secret_data(data: Mapping[str, object] | None) -> Material:
    """The Secret's `data` (base64 values). A missing or undecodable key reads as empty: renewal then
    replaces what it held and keeps what is still good."""
    values = {}
    for attr, key in _KEYS.items():
        raw = mapping(data).get(key)
        try:
            values[attr] = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
        except (binascii.Error, ValueError):
            values[attr] = b""
    return Material(**values)


def to_secret_data(material: Material) -> dict[str, str]:
    return {key: base64.b64encode(getattr(material, attr)).decode() for attr, key in _KEYS.items()}


# --- issuing -------------------------------------------------------------------------------------


def issue_ca(now: datetime, *, lifetime: timedelta = CA_LIFETIME) -> Issued:
    """A self-signed CA that may sign serving certificates only (path length 0). Its name carries the
    time it was made, so that old and new CA in one bundle are told apart by name too."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpudra webhook CA {now:%Y-%m-%dT%H:%M:%SZ}")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(_cert_pem(cert), _key_pem(key))


def issue_serving(
    now: datetime, ca: Issued, names: Sequence[str], *, lifetime: timedelta = SERVING_LIFETIME
) -> Issued:
    """A TLS server certificate for `names` (DNS names and IP addresses), signed by `ca`."""
    if not names:
        raise ConfigError("needs at least one DNS name or IP address", field="names")
    ca_cert, ca_key = read_certificates(ca.cert)[0], read_key(ca.key)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + lifetime, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(_cert_pem(cert), _key_pem(key))


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


# --- reading -------------------------------------------------------------------------------------


def read_certificates(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle, in order; ConfigError when there are none or one is damaged."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise ConfigError(f"is not a PEM certificate bundle ({err})") from err


def read_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    """An unencrypted PEM EC private key (what `issue_*` make)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"is not an unencrypted PEM private key ({err})") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"is a {type(key).__name__}; must be an EC private key")
    return key


def names_of(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses a certificate is for (its subjectAltName)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {n.lower() for n in san.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def trusts(bundle: bytes, material: Material) -> bool:
    """Whether a CA of `bundle` (PEM) signed the serving certificate of `material`."""
    try:
        serving = read_certificates(material.tls_crt)[0]
        authorities = read_certificates(bundle)
    except ConfigError:
        return False
    return any(_signed_by(serving, ca) for ca in authorities)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _wanted(names: Sequence[str]) -> set[str]:
    return {str(ipaddress.ip_address(n)) if _is_ip(n) else n.lower() for n in names}


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return cert.public_key() == key.public_key()


def chain_problem(now: datetime, bundle: bytes, material: Material, names: Sequence[str]) -> str | None:
    """Why a TLS client that trusts the CAs of `bundle` (PEM) refuses the serving certificate of
    `material` at `now` for one of `names`, or None when it accepts it for each: a full path validation
    (signatures, every certificate's validity period, key usages, names)."""
    try:
        serving, store = read_certificates(material.tls_crt)[0], verification.Store(read_certificates(bundle))
    except ConfigError as err:
        return str(err)
    for name in names:
        subject: verification.Subject = (
            x509.IPAddress(ipaddress.ip_address(name)) if _is_ip(name) else x509.DNSName(name)
        )
        verifier = verification.PolicyBuilder().store(store).time(now).build_server_verifier(subject)
        try:
            verifier.verify(serving, [])
        except verification.VerificationError as err:
            return f"a client that trusts ca.crt refuses it for {name} at {_stamp(now)}: {err}"
    return None


def _stamp(when: datetime) -> str:
    return f"{when:%Y-%m-%dT%H:%M:%SZ}"


# --- when: the validity periods against now ------------------------------------------------------


@dataclass(frozen=True)
class Validity:
    """A certificate's validity period: from `start` (notBefore) until `end` (notAfter)."""

    start: datetime
    end: datetime

    @classmethod
    def of(cls, cert: x509.Certificate) -> Validity:
        return cls(cert.not_valid_before_utc, cert.not_valid_after_utc)

    def covers(self, now: datetime) -> bool:
        return self.start <= now < self.end

    def share_left(self, now: datetime) -> float:
        """The share of the period still ahead; meaningful only where it `covers` now."""
        return (self.end - now) / (self.end - self.start)

    def gap(self, now: datetime) -> str:
        """Why the period does not cover `now`."""
        if now < self.start:
            return f"is not valid before {_stamp(self.start)}, later than now ({_stamp(now)})"
        return f"expired at {_stamp(self.end)}"


# --- renewal -------------------------------------------------------------------------------------


class Change(enum.Enum):
    """The one change renewal makes at a time (see the module docstring)."""

    EVERYTHING = "new CA and serving certificate"
    CA = "new CA beside the old one"
    SERVING = "new serving certificate"
    PRUNE = "expired CAs out of the bundle"


def _plan(now: datetime, stored: Material | None, names: Sequence[str]) -> tuple[Change, str] | None:
    """The one change the stored material needs first, and why; None when it is good."""
    if stored is None:
        return Change.EVERYTHING, "no TLS material stored"
    try:
        bundle, ca_key = read_certificates(stored.ca_crt), read_key(stored.ca_key)
    except ConfigError as err:
        return Change.EVERYTHING, f"ca.crt or ca.key is missing or unreadable: {err}"
    ca = bundle[0]
    if not _same_key(ca, ca_key):
        return Change.EVERYTHING, "ca.key does not belong to the first certificate of ca.crt"
    due = renewal_due(now, Validity.of(ca))
    if due is not None:
        return due

    try:
        serving, key = read_certificates(stored.tls_crt)[0], read_key(stored.tls_key)
    except ConfigError as err:
        return Change.SERVING, f"tls.crt or tls.key is missing or unreadable: {err}"
    if not _same_key(serving, key):
        return Change.SERVING, "tls.key does not belong to tls.crt"
    if not _signed_by(serving, ca):
        return Change.SERVING, "the serving certificate is not signed by the current CA"
    have, want = names_of(serving), _wanted(names)
    if have != want:
        return Change.SERVING, (
            f"the serving certificate is for {', '.join(sorted(have)) or 'no names'}; "
            f"the webhook is reached as {', '.join(sorted(want))}"
        )
    due = renewal_due(now, Validity.of(ca), Validity.of(serving))
    if due is not None:
        return due
    problem = chain_problem(now, stored.ca_crt, stored, names)
    if problem is not None:  # a flaw the checks above do not know: nothing trusted is left to keep
        return Change.EVERYTHING, f"the serving certificate does not verify: {problem}"
    expired = [c for c in bundle[1:] if c.not_valid_after_utc <= now]
    if expired:
        return Change.PRUNE, f"{len(expired)} old CA(s) in ca.crt expired"
    return None


def renewal_due(now: datetime, ca: Validity, serving: Validity | None = None) -> tuple[Change, str] | None:
    """The change the validity periods of the CA (and of the serving certificate, when given) ask
    for at `now`, and why; None when they need none. Only `now` counts, never the time a certificate
    was issued, so a clock that stepped ahead and back (or back and ahead) since is judged the same as
    one that never moved: a period that does not cover now is renewed, whichever side of it now lies."""
    if not ca.covers(now):
        return Change.EVERYTHING, f"the CA {ca.gap(now)}"
    if ca.share_left(now) < CA_RENEW_AT:
        return Change.CA, f"the CA expires at {_stamp(ca.end)}"
    if serving is None:
        return None
    if not serving.covers(now):
        return Change.SERVING, f"the serving certificate {serving.gap(now)}"
    if serving.share_left(now) < SERVING_RENEW_AT:
        return Change.SERVING, f"the serving certificate expires at {_stamp(serving.end)}"
    return None


def renewal_reason(now: datetime, stored: Material | None, wanted_names: Sequence[str]) -> str | None:
    """Why the stored material must change now (see the module docstring), or None when it is good."""
    plan = _plan(now, stored, wanted_names)
    return None if plan is None else f"{plan[1]}: {plan[0].value}"


def renewed(
    now: datetime,
    stored: Material | None,
    wanted_names: Sequence[str],
    *,
    ca_lifetime: timedelta = CA_LIFETIME,
    serving_lifetime: timedelta = SERVING_LIFETIME,
) -> Material:
    """`stored` after the one change `renewal_reason` names; `stored` itself when it is good."""
    plan = _plan(now, stored, wanted_names)
    if plan is None:
        assert stored is not None  # _plan answers None only for stored material
        return stored
    change = plan[0]
    if change is Change.EVERYTHING or stored is None:
        ca = issue_ca(now, lifetime=ca_lifetime)
        serving = issue_serving(now, ca, wanted_names, lifetime=serving_lifetime)
        return Material(serving.cert, serving.key, ca.cert, ca.key)
    bundle = read_certificates(stored.ca_crt)
    valid = [c for c in bundle[1:] if c.not_valid_after_utc > now]
    if change is Change.CA:
        ca = issue_ca(now, lifetime=ca_lifetime)
        # The old CA stays trusted: the serving certificate it signed is still being served.
        kept = [c for c in bundle if c.not_valid_after_utc > now]
        return Material(stored.tls_crt, stored.tls_key, ca.cert + _bundle_pem(kept), ca.key)
    if change is Change.PRUNE:
        return Material(stored.tls_crt, stored.tls_key, _bundle_pem([bundle[0], *valid]), stored.ca_key)
    serving = issue_serving(
        now, Issued(_cert_pem(bundle[0]), stored.ca_key), wanted_names, lifetime=serving_lifetime
    )
    return Material(serving.cert, serving.key, stored.ca_crt, stored.ca_key)


def _bundle_pem(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(_cert_pem(c) for c in certs)
