"""The attestation (SPEC §7): the package digest, and the ed25519 signatures over it.

It is the zip archive comment, not a member: a loader of an earlier 1.x version ignores a comment (it would refuse a
member its manifest does not list), and a member cannot be listed in the manifest it authenticates. It is a DSSE
envelope (https://github.com/secure-systems-lab/dsse) whose payload is an in-toto v1
statement with one subject, ``manifest.json``, and that file's SHA-256: the **package digest**. The manifest lists
every other member's SHA-256, so the digest covers every byte of every member. An unsigned package has an envelope
with no signatures; signing adds one per key, over DSSE's pre-authentication encoding of the payload bytes (the
bytes received are the bytes verified, never a re-encoding). These are the layers the OpenSSF model-signing format
and Sigstore bundles use; SPEC §7 says why the predicate is our own.

Parsing is for hostile input: every field is type-checked, base64 is strict, sizes are bounded, and every defect
is a FormatError naming the field. Signing and verifying use ``cryptography`` (imported only when keys are used).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass

from .errors import FormatError, SignatureError, clip as _clip

ATTESTATION_NAME = "the attestation (the archive comment)"
MAX_ATTESTATION_BYTES = 0xFFFF  # a zip comment's limit: room for hundreds of signatures
MAX_SIGNATURES = 64
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tcexport.dev/tcpkg/v1"
SUBJECT = "manifest.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Signature:
    keyid: str   # hex SHA-256 of the signer's public key as PEM SubjectPublicKeyInfo (model-signing's key hint)
    sig: bytes   # the 64-byte ed25519 signature over pae(PAYLOAD_TYPE, payload)


@dataclass(frozen=True)
class Attestation:
    payload: bytes      # the statement's bytes, exactly as stored (and signed)
    digest: str         # the statement's subject digest: SHA-256 of manifest.json, lowercase hex
    signatures: tuple   # Signature, in the envelope's order

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces, trailing newline): the same attestation is the same bytes."""
        envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(self.payload).decode("ascii"),
                    "signatures": [{"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
                                   for s in self.signatures]}
        return (json.dumps(envelope, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")


def package_digest(manifest_bytes) -> str:
    """The package digest: SHA-256 of manifest.json's bytes as stored."""
    return hashlib.sha256(manifest_bytes).hexdigest()


def statement(digest: str, format_version: tuple) -> bytes:
    """The in-toto statement naming ``manifest.json`` by its digest, as canonical JSON bytes."""
    body = {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE,
            "subject": [{"name": SUBJECT, "digest": {"sha256": digest}}],
            "predicate": {"format_version": list(format_version)}}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")


def unsigned(manifest_bytes, format_version: tuple) -> Attestation:
    digest = package_digest(manifest_bytes)
    return Attestation(statement(digest, format_version), digest, ())


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what a signature actually signs."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


# ---------------------------------------------------------------------------------------------------------
# parsing


def parse(raw: bytes, where: str) -> Attestation:
    """The envelope and its statement, every field checked; FormatError names what is wrong."""
    if len(raw) > MAX_ATTESTATION_BYTES:
        raise FormatError(f"{where}: {ATTESTATION_NAME} is {len(raw)} bytes; the limit is {MAX_ATTESTATION_BYTES}")
    envelope = _json_object(raw, where, ATTESTATION_NAME)
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise FormatError(f"{where}: {ATTESTATION_NAME}: payloadType should be {PAYLOAD_TYPE!r}, found "
                          f"{_clip(envelope.get('payloadType'))}")
    payload = _b64(envelope.get("payload"), where, "payload")
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or len(sigs) > MAX_SIGNATURES:
        raise FormatError(f"{where}: {ATTESTATION_NAME}: signatures should be a list of at most {MAX_SIGNATURES}, "
                          f"found {_clip(sigs)}")
    signatures = tuple(_signature(s, where, k) for k, s in enumerate(sigs))
    return Attestation(payload, _subject_digest(payload, where), signatures)


def _json_object(raw: bytes, where: str, what: str) -> dict:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise FormatError(f"{where}: {what} is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(value, dict):
        raise FormatError(f"{where}: {what} should be a JSON object, found {type(value).__name__}")
    return value


def _b64(value, where: str, field: str) -> bytes:
    if not isinstance(value, str):
        raise FormatError(f"{where}: {ATTESTATION_NAME}: {field} should be a base64 string, found {_clip(value)}")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise FormatError(f"{where}: {ATTESTATION_NAME}: {field} is not valid base64") from None


def _signature(s, where: str, k: int) -> Signature:
    if not isinstance(s, dict) or not isinstance(s.get("keyid"), str) or not _HEX64.match(s["keyid"]):
        raise FormatError(f"{where}: {ATTESTATION_NAME}: signatures[{k}] should be {{'keyid': 64 hex digits, "
                          f"'sig': base64}}, found {_clip(s)}")
    sig = _b64(s.get("sig"), where, f"signatures[{k}].sig")
    if len(sig) != 64:
        raise FormatError(f"{where}: {ATTESTATION_NAME}: signatures[{k}].sig is {len(sig)} bytes; an ed25519 "
                          f"signature is 64")
    return Signature(s["keyid"], sig)


def _subject_digest(payload: bytes, where: str) -> str:
    body = _json_object(payload, where, f"{ATTESTATION_NAME}'s statement")
    if body.get("_type") != STATEMENT_TYPE or body.get("predicateType") != PREDICATE_TYPE:
        raise FormatError(f"{where}: {ATTESTATION_NAME}: the statement should have _type {STATEMENT_TYPE!r} and "
                          f"predicateType {PREDICATE_TYPE!r}, found {_clip(body.get('_type'))} and "
                          f"{_clip(body.get('predicateType'))}")
    subject = body.get("subject")
    if not (isinstance(subject, list) and len(subject) == 1 and isinstance(subject[0], dict)
            and subject[0].get("name") == SUBJECT and isinstance(subject[0].get("digest"), dict)
            and isinstance(subject[0]["digest"].get("sha256"), str) and _HEX64.match(subject[0]["digest"]["sha256"])):
        raise FormatError(f"{where}: {ATTESTATION_NAME}: the statement's subject should be one entry "
                          f"{{'name': {SUBJECT!r}, 'digest': {{'sha256': 64 lowercase hex digits}}}}, found "
                          f"{_clip(subject)}")
    return subject[0]["digest"]["sha256"]


# ---------------------------------------------------------------------------------------------------------
# keys, signing and verifying (cryptography, imported when keys are used)


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SignatureError("signing and verifying packages needs the 'cryptography' package: "
                             "pip install 'tcexport[sign]'") from None
    return serialization, ed25519


def keyid(public_key) -> str:
    """Hex SHA-256 of the key's PEM SubjectPublicKeyInfo, the hint the OpenSSF model-signing format uses."""
    serialization, _ = _crypto()
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def load_private_key(source, what: str = "signing key"):
    """An ed25519 private key from a PEM file path or PEM bytes (``openssl genpkey -algorithm ed25519``)."""
    serialization, ed25519 = _crypto()
    data = _key_bytes(source, what)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SignatureError(f"{what} {_name(source)} is encrypted; decrypt it first "
                             f"(openssl pkey -in KEY.pem -out PLAIN.pem)") from None
    except (ValueError, TypeError) as e:
        raise SignatureError(f"{what} {_name(source)} is not a PEM private key ({e}); make one with "
                             f"`openssl genpkey -algorithm ed25519 -out KEY.pem`") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"{what} {_name(source)} is a {type(key).__name__}; packages are signed with ed25519 "
                             f"keys (`openssl genpkey -algorithm ed25519`)")
    return key


def load_public_key(source, what: str = "trusted key"):
    """An ed25519 public key from a path, PEM or DER bytes, 32 raw bytes, a key object, or a private key (whose
    public half is taken)."""
    serialization, ed25519 = _crypto()
    if isinstance(source, ed25519.Ed25519PublicKey):
        return source
    if isinstance(source, ed25519.Ed25519PrivateKey):
        return source.public_key()
    data = _key_bytes(source, what)
    if len(data) == 32:
        return ed25519.Ed25519PublicKey.from_public_bytes(data)
    for load in (serialization.load_pem_public_key, serialization.load_der_public_key):
        try:
            key = load(data)
            break
        except (ValueError, TypeError):
            continue
    else:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError):
            raise SignatureError(f"{what} {_name(source)} is not an ed25519 public key (PEM, DER or 32 raw bytes); "
                                 f"make one with `openssl pkey -in KEY.pem -pubout -out PUB.pem`") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SignatureError(f"{what} {_name(source)} is a {type(key).__name__}; packages are signed with ed25519 "
                             f"keys")
    return key


def _key_bytes(source, what: str) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    try:
        with open(source, "rb") as f:
            return f.read(1 << 16)
    except (OSError, TypeError, ValueError) as e:
        raise SignatureError(f"cannot read {what} {_name(source)}: {getattr(e, 'strerror', None) or e}") from None


def _name(source) -> str:
    return f"{len(source)} bytes" if isinstance(source, (bytes, bytearray, memoryview)) else repr(str(source))


def sign(attestation: Attestation, private_key) -> Attestation:
    """The attestation with ``private_key``'s signature added (replacing an earlier one by the same key)."""
    kid = keyid(private_key.public_key())
    sig = Signature(kid, private_key.sign(pae(PAYLOAD_TYPE, attestation.payload)))
    others = tuple(s for s in attestation.signatures if s.keyid != kid)
    return Attestation(attestation.payload, attestation.digest, others + (sig,))


def verify(attestation: Attestation, trusted: dict, where: str) -> list[str]:
    """The keyids of the trusted keys (``{keyid: public key}``) whose signature verifies; SignatureError if none.
    A signature by a trusted key that fails to verify is an alteration and is reported even if another passes."""
    from cryptography.exceptions import InvalidSignature

    message = pae(PAYLOAD_TYPE, attestation.payload)
    good, bad = [], []
    for s in attestation.signatures:
        key = trusted.get(s.keyid)
        if key is None:
            continue
        try:
            key.verify(s.sig, message)
            good.append(s.keyid)
        except InvalidSignature:
            bad.append(s.keyid)
    if bad:
        raise SignatureError(f"{where}: the signature by trusted key {bad[0][:16]}... does not verify: the "
                             f"package was altered after it was signed. Rebuild or re-sign it from a trusted "
                             f"copy.")
    if not good:
        present = [s.keyid[:16] + "..." for s in attestation.signatures]
        raise SignatureError(
            f"{where}: " + (f"the package is signed by {', '.join(present)}, none of them a trusted key "
                            if present else "the package is unsigned; ")
            + f"(trusted: {', '.join(k[:16] + '...' for k in sorted(trusted))}). Sign it with "
              f"`tcpkg sign PKG --key KEY.pem` using a trusted key, or trust its signer's public key.")
    return good


def trusted_keys(sources) -> dict:
    """``{keyid: public key}`` for the trusted keys given (paths, key bytes or key objects); at least one."""
    keys = {}
    for source in sources:
        key = load_public_key(source)
        keys[keyid(key)] = key
    if not keys:
        raise SignatureError("trusted keys were requested but none was given; pass at least one public key "
                             "(trusted_keys=None does not require signatures)")
    return keys
