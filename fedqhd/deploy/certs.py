"""Credentials for a deployment: a private CA, the SuperLink's TLS certificate,
SuperNode authentication keys and SuperExec shared secrets.

Made with the ``cryptography`` package (a Flower dependency) so that the
launcher, CI and the compose ``certs`` service need no ``openssl`` binary.
Layout under ``out`` (one folder per service: the launcher and ``docker-compose.yml``
mount each service's folder only)::

    ca/ca.crt, ca/ca.key            private CA (keep ca.key off every service)
    superlink/ca.crt, server.pem, server.key
    superlink/superexec.secret      SuperLink <-> ServerApp SuperExec HMAC secret
    superexec-serverapp/ca.crt, superexec.secret   (the same secret)
    supernode-<i>/ca.crt            what SuperNode i needs to verify the SuperLink
    supernode-<i>/supernode.key     its ECDSA P-384 private key (OpenSSH format)
    supernode-<i>/supernode.pub     the public key the operator registers
    supernode-<i>/superexec.secret  SuperNode i <-> its SuperExec HMAC secret
    public/ca.crt, public/supernode-<i>.pub   for the operator (``flwr supernode register``)

Existing files are kept: rerunning with a larger ``num_supernodes`` only adds keys.
Rerunning with a smaller one removes the SuperNodes above it (their files listed above,
nothing else): ``public/`` would otherwise keep their keys, and whoever registers every
``public/supernode-*.pub`` (the compose ``register`` service, docs/deployment.md's loop)
would let those SuperNodes join again.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedqhd.files import tight_folder

#: names every server certificate carries: loopback, and the compose service name
DEFAULT_SANS = ("localhost", "127.0.0.1", "superlink")

_PEM = serialization.Encoding.PEM


#: credential folders others may read (every other one holds a key or a secret: 0700)
PUBLIC_FOLDERS = ("public",)
#: what a SuperNode's folder ``supernode-<i>/`` holds (the files removed when scaling down)
NODE_FILES = ("ca.crt", "supernode.key", "supernode.pub", "superexec.secret")

#: one DNS label (RFC 1123: letters, digits, inner hyphens, at most 63 characters)
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_NODE_NAME = re.compile(r"supernode-([1-9][0-9]*)")


def _folder(path: Path) -> Path:
    """A credentials folder with its final mode whatever the umask or its earlier mode:
    0755 for :data:`PUBLIC_FOLDERS`, else 0700 (nobody else may list, swap or delete a key).
    Not checked for its owner: the compose ``certs`` service reruns as root on folders it
    gave the app user."""
    return tight_folder(path, 0o755 if path.name in PUBLIC_FOLDERS else 0o700, own=False)


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    """Write ``data`` with its final mode from the start: a private file is never
    readable by others, not even between creating it and a later chmod."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)  # an existing file keeps its mode on open: set it
        f.write(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedqhd"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def check_san(name: str) -> str:
    """``name`` if it is an IP address or a DNS name (a leading ``*.`` allowed), else a
    :class:`ValueError` saying why: a certificate would carry any string as a DNS name,
    and no client could ever match it."""
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    labels = name.removeprefix("*.").split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{name!r} is neither an IP address nor a DNS name (letters, "
                         "digits and inner hyphens, dot-separated)")
    if labels[-1].isdigit():
        raise ValueError(f"{name!r} is not an IP address (and a DNS name does not end "
                         "in a number)")
    return name


def _san(names: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # keep order, drop duplicates
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(check_san(name)))
    return x509.SubjectAlternativeName(entries)


def make_ca(out: Path, days: int = 365) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA (``ca/ca.crt``, ``ca/ca.key``) that only signs the SuperLink."""
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(_name("fedqhd deployment CA")).issuer_name(_name("fedqhd deployment CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA384()))
    _write(out / "ca" / "ca.crt", cert.public_bytes(_PEM))
    _write(out / "ca" / "ca.key", _key_pem(key), private=True)
    return key, cert


def make_server_cert(out: Path, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                     sans: Iterable[str] = DEFAULT_SANS, days: int = 365) -> Path:
    """The SuperLink's certificate, valid for every name in ``sans`` (IPs or DNS names)."""
    key = ec.generate_private_key(ec.SECP384R1())
    names = list(dict.fromkeys([*DEFAULT_SANS, *sans]))
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(names[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA384()))
    folder = out / "superlink"
    _write(folder / "ca.crt", ca_cert.public_bytes(_PEM))
    _write(folder / "server.key", _key_pem(key), private=True)
    return _write(folder / "server.pem", cert.public_bytes(_PEM))


def make_supernode_key(folder: Path, comment: str = "") -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format (what ``flwr supernode register`` and
    ``--auth-supernode-private-key`` take) in ``folder`` (made 0700); returns (private,
    public) paths."""
    _folder(folder)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(_PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    if comment:
        public += b" " + comment.encode()
    return (_write(folder / "supernode.key", private, private=True),
            _write(folder / "supernode.pub", public + b"\n"))


def make_secret(path: Path) -> Path:
    """A random SuperExec shared secret (HMAC key; the file is read as raw bytes)."""
    return _write(path, secrets.token_hex(32).encode(), private=True)


def _load_ca(root: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    key_path, cert_path = root / "ca" / "ca.key", root / "ca" / "ca.crt"
    if not (key_path.is_file() and cert_path.is_file()):
        return None
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: not an EC key")
    return key, x509.load_pem_x509_certificate(cert_path.read_bytes())


def stale_node_files(root: Path, num_supernodes: int) -> list[Path]:
    """The files of SuperNodes numbered above ``num_supernodes`` that
    :func:`make_credentials` wrote into ``root`` (their :data:`NODE_FILES` and
    ``public/supernode-<i>.pub``), to remove when scaling down."""
    found: list[Path] = []
    for path in sorted([*root.glob("supernode-*"), *root.glob("public/supernode-*.pub")]):
        match = _NODE_NAME.fullmatch(path.name.removesuffix(".pub"))
        if not match or int(match.group(1)) <= num_supernodes:
            continue
        if path.parent.name == "public":
            found += [path] if path.is_file() else []
        elif path.is_dir():
            found += [path / name for name in NODE_FILES if (path / name).is_file()]
    return found


def make_credentials(out: str | os.PathLike[str], num_supernodes: int,
                     sans: Iterable[str] = (), days: int = 365, owner: int | None = None
                     ) -> Path:
    """Everything a deployment of ``num_supernodes`` SuperNodes needs, under ``out``.

    SuperNode folders are numbered from 1 (as compose services); SuperNode ``i`` reads
    partition ``i - 1``. What exists is kept, so scaling up adds keys without
    invalidating the registered ones; scaling down removes :func:`stale_node_files` (a
    folder left empty goes too). ``owner`` (a uid) chowns the files, e.g. to the ``app``
    user (49999) of Flower's images when the compose ``certs`` service runs as root.
    Bad arguments raise :class:`ValueError` before anything is written.
    """
    if num_supernodes < 1:
        raise ValueError("num_supernodes must be >= 1")
    if days < 1:
        raise ValueError(f"days must be >= 1 (a certificate valid for {days} days would "
                         "be expired when written)")
    sans = [check_san(name) for name in sans]
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    info = root.stat()
    if info.st_uid == os.geteuid() or os.geteuid() == 0:  # nobody else swaps a folder in it
        os.chmod(root, stat.S_IMODE(info.st_mode) & ~0o022)
    for name in ("ca", "superlink", "superexec-serverapp", *PUBLIC_FOLDERS,
                 *(f"supernode-{i}" for i in range(1, num_supernodes + 1))):
        _folder(root / name)  # before a key goes in
    loaded = _load_ca(root)
    ca_key, ca_cert = loaded if loaded else make_ca(root, days)
    ca_pem = ca_cert.public_bytes(_PEM)
    if not (root / "superlink" / "server.pem").is_file():
        make_server_cert(root, ca_key, ca_cert, sans, days)
    secret = root / "superlink" / "superexec.secret"
    if not secret.is_file():
        make_secret(secret)
    _write(root / "superexec-serverapp" / "ca.crt", ca_pem)
    _write(root / "superexec-serverapp" / "superexec.secret", secret.read_bytes(), private=True)
    _write(root / "public" / "ca.crt", ca_pem)
    for i in range(1, num_supernodes + 1):
        folder = root / f"supernode-{i}"
        _write(folder / "ca.crt", ca_pem)
        if not (folder / "supernode.key").is_file():
            make_supernode_key(folder, f"supernode-{i}")
        _write(root / "public" / f"supernode-{i}.pub", (folder / "supernode.pub").read_bytes())
        if not (folder / "superexec.secret").is_file():
            make_secret(folder / "superexec.secret")
    for path in stale_node_files(root, num_supernodes):
        path.unlink()
        if path.parent.name != "public" and not any(path.parent.iterdir()):
            path.parent.rmdir()
    if owner is not None:
        for path in [root, *root.rglob("*")]:
            os.chown(path, owner, owner)
    return root
