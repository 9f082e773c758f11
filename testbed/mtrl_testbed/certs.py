"""Certificates for the local control plane, made with `cryptography`.

One CA signs the serving certificates (the API server's, and the node agent's log endpoint's,
`kubelet`) and the client certificates; a separate RSA key pair signs and verifies
service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files under one directory."""

    root: Path

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def ca_cert(self) -> Path:
        return self.path("ca.crt")


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
           issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, *, ca: bool,
           usages: list[x509.ObjectIdentifier], sans: list[x509.GeneralName]) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=not ca, content_commitment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
            encipher_only=False, decipher_only=False), critical=True)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(root: Path, *, clients: dict[str, tuple[str, str | None]],
             apiserver_ips: tuple[str, ...] = ()) -> Pki:
    """Write a CA, the serving pairs of the API server (`apiserver`) and of the node agent's log
    endpoint (`kubelet`), the service-account key pair and one client pair per entry of
    `clients` (file stem -> (user name, group)); `apiserver_ips` are more addresses the API
    server's certificate names (the machine's own, where pods of a real node reach it)."""
    root.mkdir(parents=True, exist_ok=True)
    pki = Pki(root)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("mtrl-local-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True, usages=[], sans=[])
    _write_key(pki.path("ca.key"), ca_key)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    loopback = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    servers: dict[str, tuple[str, list[x509.GeneralName]]] = {
        "apiserver": ("kube-apiserver", [
            x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                      "kubernetes.default.svc",
                                      "kubernetes.default.svc.cluster.local")
        ] + [*loopback, x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
             *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in apiserver_ips)]),
        "kubelet": ("mtrl-node-agent", [x509.DNSName("localhost"), *loopback]),
    }
    for stem, (common_name, sans) in servers.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(_name(common_name), key, ca_name, ca_key, ca=False,
                      usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)
        _write_key(pki.path(f"{stem}.key"), key)
        pki.path(f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    for stem, (user, group) in clients.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(_name(user, group), key, ca_name, ca_key, ca=False,
                      usages=[ExtendedKeyUsageOID.CLIENT_AUTH], sans=[])
        _write_key(pki.path(f"{stem}.key"), key)
        pki.path(f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.path("sa.key"), sa_key)
    pki.path("sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def issue(pki: Pki, stem: str, common_name: str, organization: str | None = None, *,
          server_ips: list[str] | None = None, server_names: list[str] | None = None) -> None:
    """Write `<stem>.crt`/`<stem>.key` signed by the CA of `pki`: a client certificate for
    `common_name` (in group `organization`), or, given `server_ips`/`server_names`, a serving
    certificate with those SANs (a real kubelet's, for its node IP)."""
    ca_key = serialization.load_pem_private_key(pki.path("ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    serving = server_ips is not None or server_names is not None
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names or []]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips or []]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name(common_name, organization), key, ca_name, ca_key, ca=False,
                  usages=[ExtendedKeyUsageOID.SERVER_AUTH if serving
                          else ExtendedKeyUsageOID.CLIENT_AUTH], sans=sans)
    _write_key(pki.path(f"{stem}.key"), key)
    pki.path(f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class WebhookPki:
    """A webhook server's CA and serving pair, PEM-encoded, as a cert rotator keeps them in its
    Secret (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`)."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def secret_data(self) -> dict[str, bytes]:
        return {"ca.crt": self.ca_cert, "ca.key": self.ca_key, "tls.crt": self.cert,
                "tls.key": self.key}


def webhook_pki(ca_name: str, dns_names: list[str], validity: dt.timedelta = _VALIDITY
                ) -> WebhookPki:
    """A CA named `ca_name` and a serving pair for `dns_names` and 127.0.0.1.

    open-policy-agent/cert-controller (the cert rotator of Kubeflow's training operator and of
    Kueue) keeps the pair it finds in its Secret when both verify: the CA against its own name
    as a DNS name, the serving cert against the webhook Service's DNS name, each valid beyond
    its 90-day look-ahead (pkg/rotator/rotator.go, `validCACert`, `validServerCert`); it reads
    the CA key as PKCS#1 RSA (`x509.ParsePKCS1PrivateKey`), so the keys are RSA. The API server
    reaches the webhook on loopback, so 127.0.0.1 is a SAN too."""
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_subject = _name(ca_name)
    now = dt.datetime.now(dt.UTC)
    ca = (x509.CertificateBuilder()
          .subject_name(ca_subject).issuer_name(ca_subject).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + validity)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=True, key_encipherment=False, content_commitment=False,
              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
              encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = _issue(_name(dns_names[0]), key, ca_subject, ca_key, ca=False,
                  usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)

    def pem_key(k: rsa.RSAPrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM,
                               serialization.PrivateFormat.TraditionalOpenSSL,
                               serialization.NoEncryption())

    return WebhookPki(ca.public_bytes(serialization.Encoding.PEM), pem_key(ca_key),
                      cert.public_bytes(serialization.Encoding.PEM), pem_key(key))
