"""The few MLS (RFC 9420) structures a DAVE voice gateway reads and writes, in TLS presentation language.

Hand-written because no Python MLS library does the external sender's part (signing Add and Remove proposals as a
PublicMessage from ``external``): the client libraries (davey, OpenMLS, mlspp) only play members. Only what the
delivery service needs is here: the external sender package, key packages (parsed and their signature checked),
external proposals (built and signed with ECDSA P-256/SHA-256, ciphersuite 2), the framing of a member's commit
(to split it from the welcome and to check epoch, sender and proposal references) and welcomes (split per new member).
Group secrets, trees and HPKE stay the members' business.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

MLS_VERSION = 1  # mls10
CIPHERSUITE = 2  # MLS_128_DHKEMP256_AES128GCM_SHA256_P256, what DAVE protocol version 1 uses
WIRE_PUBLIC_MESSAGE = 1
WIRE_KEY_PACKAGE = 5
SENDER_MEMBER, SENDER_EXTERNAL = 1, 2
CONTENT_PROPOSAL, CONTENT_COMMIT = 2, 3
PROPOSAL_ADD, PROPOSAL_REMOVE = 1, 3
PROPOSAL_OR_REF_REFERENCE = 2
CREDENTIAL_BASIC = 1
LEAF_SOURCE_KEY_PACKAGE, LEAF_SOURCE_UPDATE, LEAF_SOURCE_COMMIT = 1, 2, 3
LIFETIME_MAX = (0, 2**64 - 1)  # (not_before, not_after) DAVE requires on every key package


class MlsError(ValueError):
    """Bytes that are not the MLS structure expected; the message says what and where."""


# ---- TLS presentation language -----------------------------------------------------------------------------------

class Reader:
    """Reads TLS-encoded fields from a buffer, front to back."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        if n < 0 or self.pos + n > len(self.data):
            raise MlsError(f"truncated: wanted {n} bytes at offset {self.pos} of {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int) -> int:
        """A big-endian unsigned integer of ``size`` bytes."""
        return int.from_bytes(self.take(size), "big")

    def varint(self) -> int:
        """A variable-size vector length (RFC 9420 section 2.1.2): 1, 2 or 4 bytes, the top two bits say which."""
        first = self.uint(1)
        prefix = first >> 6
        if prefix == 3:
            raise MlsError(f"invalid vector length prefix at offset {self.pos - 1}")
        value = first & 0x3F
        for _ in range((1 << prefix) - 1):
            value = (value << 8) | self.uint(1)
        if prefix and value < (1 << (8 * (1 << (prefix - 1)) - 2)):
            raise MlsError(f"vector length {value} not minimally encoded at offset {self.pos}")
        return value

    def vector(self) -> bytes:
        """``opaque x<V>``: a variable-size length, then that many bytes."""
        return self.take(self.varint())

    def done(self) -> bool:
        """Whether every byte has been read."""
        return self.pos == len(self.data)

    def expect_end(self, what: str) -> None:
        """Fail unless every byte has been read."""
        if not self.done():
            raise MlsError(f"{len(self.data) - self.pos} unexpected bytes after the {what}")


def varint(n: int) -> bytes:
    """The minimal variable-size encoding of a vector length."""
    if n < 1 << 6:
        return bytes([n])
    if n < 1 << 14:
        return struct.pack(">H", 0x4000 | n)
    if n < 1 << 30:
        return struct.pack(">I", 0x8000_0000 | n)
    raise MlsError(f"vector of {n} bytes is too long for MLS")


def vector(data: bytes) -> bytes:
    """``opaque x<V>``."""
    return varint(len(data)) + data


def u16(n: int) -> bytes:
    """``uint16``."""
    return struct.pack(">H", n)


def u32(n: int) -> bytes:
    """``uint32``."""
    return struct.pack(">I", n)


def u64(n: int) -> bytes:
    """``uint64``."""
    return struct.pack(">Q", n)


def ref_hash(label: str, value: bytes) -> bytes:
    """RefHash (RFC 9420 section 5.2) with the ciphersuite's SHA-256."""
    return hashlib.sha256(vector(f"MLS 1.0 {label}".encode()) + vector(value)).digest()


def _sign_content(label: str, content: bytes) -> bytes:
    """The SignContent struct that SignWithLabel signs (RFC 9420 section 5.1.2)."""
    return vector(f"MLS 1.0 {label}".encode()) + vector(content)


# ---- the external sender -----------------------------------------------------------------------------------------

class ExternalSender:
    """The voice gateway's MLS identity: a P-256 signing key and a basic credential.

    Parameters
    ----------
    identity
        The credential's identity bytes (Discord's gateway uses its own; members only compare them).
    """

    def __init__(self, identity: bytes = b"voicebot-standin-gateway") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self.public_key = self._key.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        self.identity = identity

    def package(self) -> bytes:
        """The ExternalSender struct sent in op 25: signature_key<V>, then a basic Credential."""
        return vector(self.public_key) + u16(CREDENTIAL_BASIC) + vector(self.identity)

    def proposal(self, group_id: bytes, epoch: int, body: bytes) -> tuple[bytes, bytes]:
        """Frame and sign one proposal as a PublicMessage from external sender 0.

        Parameters
        ----------
        group_id, epoch
            The group context the members hold (DAVE: the channel id as 8 big-endian bytes).
        body
            The encoded Proposal (type and payload), e.g. from :func:`add_proposal`.

        Returns
        -------
        tuple[bytes, bytes]
            The MLSMessage and its ProposalRef (the hash members cite in their commit).
        """
        content = (vector(group_id) + u64(epoch) + bytes([SENDER_EXTERNAL]) + u32(0) + vector(b"")
                   + bytes([CONTENT_PROPOSAL]) + body)
        # FramedContentTBS carries no GroupContext for an external sender
        tbs = u16(MLS_VERSION) + u16(WIRE_PUBLIC_MESSAGE) + content
        signature = self._key.sign(_sign_content("FramedContentTBS", tbs), ec.ECDSA(hashes.SHA256()))
        auth = vector(signature)
        message = u16(MLS_VERSION) + u16(WIRE_PUBLIC_MESSAGE) + content + auth
        return message, ref_hash("Proposal Reference", u16(WIRE_PUBLIC_MESSAGE) + content + auth)


def add_proposal(key_package: KeyPackage) -> bytes:
    """An Add proposal for a member's key package."""
    return u16(PROPOSAL_ADD) + key_package.raw


def remove_proposal(leaf_index: int) -> bytes:
    """A Remove proposal for the member at ``leaf_index``."""
    return u16(PROPOSAL_REMOVE) + u32(leaf_index)


# ---- key packages and leaf nodes ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LeafNode:
    """The fields of a LeafNode the gateway checks."""

    signature_key: bytes
    credential_type: int
    identity: bytes
    source: int
    lifetime: tuple[int, int] | None

    @property
    def user_id(self) -> int | None:
        """The Discord user id in a DAVE basic credential (8 big-endian bytes), or None."""
        if self.credential_type != CREDENTIAL_BASIC or len(self.identity) != 8:
            return None
        return int.from_bytes(self.identity, "big")


def read_leaf_node(r: Reader) -> LeafNode:
    """Parse one LeafNode (RFC 9420 section 7.2)."""
    r.vector()  # encryption_key
    signature_key = r.vector()
    credential_type = r.uint(2)
    if credential_type != CREDENTIAL_BASIC:
        raise MlsError(f"credential type {credential_type}; DAVE allows basic (1) only")
    identity = r.vector()
    for _ in range(5):  # capabilities: versions, ciphersuites, extensions, proposals, credentials
        r.vector()
    source = r.uint(1)
    lifetime = None
    if source == LEAF_SOURCE_KEY_PACKAGE:
        lifetime = (r.uint(8), r.uint(8))
    elif source == LEAF_SOURCE_COMMIT:
        r.vector()  # parent_hash
    elif source != LEAF_SOURCE_UPDATE:
        raise MlsError(f"unknown leaf node source {source}")
    r.vector()  # extensions
    r.vector()  # signature
    return LeafNode(signature_key, credential_type, identity, source, lifetime)


@dataclass(frozen=True)
class KeyPackage:
    """A member's key package (op 26), with its KeyPackageRef."""

    raw: bytes
    leaf: LeafNode
    ref: bytes


def parse_key_package(data: bytes) -> KeyPackage:
    """Parse and verify a key package: ciphersuite 2, a basic credential, the signature over KeyPackageTBS.

    DAVE's text calls op 26 an MLSMessage, but davey (and libdave) send the bare KeyPackage; both are accepted.
    """
    if data[:4] == u16(MLS_VERSION) + u16(WIRE_KEY_PACKAGE):
        data = data[4:]
    r = Reader(data)
    version, suite = r.uint(2), r.uint(2)
    if version != MLS_VERSION or suite != CIPHERSUITE:
        raise MlsError(f"key package for MLS version {version}, ciphersuite {suite}; DAVE v1 needs 1 and 2")
    r.vector()  # init_key
    leaf = read_leaf_node(r)
    r.vector()  # extensions
    tbs_end = r.pos
    signature = r.vector()
    r.expect_end("key package")
    if leaf.source != LEAF_SOURCE_KEY_PACKAGE:
        raise MlsError(f"key package leaf node has source {leaf.source}, expected 1 (key_package)")
    _verify(leaf.signature_key, signature, _sign_content("KeyPackageTBS", data[:tbs_end]), "key package")
    return KeyPackage(data, leaf, ref_hash("KeyPackage Reference", data))


def _verify(public_key: bytes, signature: bytes, message: bytes, what: str) -> None:
    """Check an ECDSA P-256/SHA-256 signature (DER, as MLS encodes it)."""
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), public_key)
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError) as e:
        raise MlsError(f"bad {what} signature") from e


# ---- commits and welcomes ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Commit:
    """The framing of a member's commit (a PublicMessage) as the gateway inspects it."""

    raw: bytes  # the whole MLSMessage, as announced in op 29
    group_id: bytes
    epoch: int
    sender_leaf: int
    proposal_refs: tuple[bytes, ...]
    inline_proposals: int  # proposals carried by value; DAVE allows references only
    path_leaf: LeafNode | None


def read_commit(r: Reader) -> Commit:
    """Parse one commit MLSMessage from the reader's position, leaving it just past the message."""
    start = r.pos
    version, wire_format = r.uint(2), r.uint(2)
    if version != MLS_VERSION or wire_format != WIRE_PUBLIC_MESSAGE:
        raise MlsError(f"commit must be an MLS 1.0 PublicMessage, got version {version}, wire format {wire_format}")
    group_id, epoch = r.vector(), r.uint(8)
    sender_type = r.uint(1)
    if sender_type != SENDER_MEMBER:
        raise MlsError(f"commit from sender type {sender_type}; DAVE commits come from members")
    sender_leaf = r.uint(4)
    r.vector()  # authenticated_data
    content_type = r.uint(1)
    if content_type != CONTENT_COMMIT:
        raise MlsError(f"content type {content_type} where a commit (3) was expected")
    proposals = Reader(r.vector())
    refs: list[bytes] = []
    inline = 0
    while not proposals.done():
        if proposals.uint(1) != PROPOSAL_OR_REF_REFERENCE:
            inline += 1
            break  # an inline proposal's length needs its type; DAVE rejects the commit anyway
        refs.append(proposals.vector())
    path_leaf = None
    if r.uint(1):
        path_leaf = read_leaf_node(r)
        r.vector()  # nodes
    r.vector()  # signature
    r.vector()  # confirmation_tag
    r.vector()  # membership_tag
    return Commit(r.data[start : r.pos], group_id, epoch, sender_leaf, tuple(refs), inline, path_leaf)


@dataclass(frozen=True)
class Welcome:
    """A Welcome: the group secrets per new member (by KeyPackageRef) and the encrypted group info."""

    cipher_suite: int
    secrets: tuple[tuple[bytes, bytes], ...]  # (KeyPackageRef, the encoded EncryptedGroupSecrets)
    encrypted_group_info: bytes

    def for_member(self, key_package_ref: bytes) -> bytes | None:
        """The Welcome re-encoded with only the secrets for one new member (what op 30 carries), or None."""
        mine = [encoded for ref, encoded in self.secrets if ref == key_package_ref]
        if not mine:
            return None
        return u16(self.cipher_suite) + vector(b"".join(mine)) + vector(self.encrypted_group_info)

    @property
    def refs(self) -> list[bytes]:
        """The KeyPackageRefs of the members this welcome adds."""
        return [ref for ref, _ in self.secrets]


def read_welcome(r: Reader) -> Welcome:
    """Parse a bare Welcome (as DAVE's op 28 and 30 carry it)."""
    suite = r.uint(2)
    secrets = Reader(r.vector())
    entries: list[tuple[bytes, bytes]] = []
    while not secrets.done():
        start = secrets.pos
        ref = secrets.vector()
        secrets.vector()  # kem_output
        secrets.vector()  # ciphertext
        entries.append((ref, secrets.data[start : secrets.pos]))
    return Welcome(suite, tuple(entries), r.vector())


def parse_commit_welcome(data: bytes) -> tuple[Commit, Welcome | None]:
    """Split op 28's payload into the commit and, when members are added, the welcome that follows it."""
    r = Reader(data)
    commit = read_commit(r)
    welcome = None if r.done() else read_welcome(r)
    r.expect_end("commit and welcome")
    return commit, welcome


__all__ = [
    "Commit", "ExternalSender", "KeyPackage", "LeafNode", "MlsError", "Welcome", "add_proposal",
    "parse_commit_welcome", "parse_key_package", "remove_proposal",
]
