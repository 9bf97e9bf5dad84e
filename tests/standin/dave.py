"""DAVE (Discord's end-to-end encryption for voice) in the stand-in: the voice gateway's MLS delivery service and
external sender, and a listening member made with ``davey``.

Follows Discord's published protocol (github.com/discord/dave-protocol, protocol.md, v1.1.4). Per voice channel a
:class:`DaveGroup` holds what the gateway knows of the MLS group (group id = the channel id as 8 big-endian bytes,
epoch, each member's leaf index): it sends its external sender package (op 25), turns each member's key package
(op 26) into an Add proposal it signs (op 27; Remove for members who leave or flag an invalid commit), announces the
first valid commit of an epoch (op 29) and hands each new member its part of the welcome (op 30), then executes the
transition (op 22) once every member is ready (op 23) or after ``TRANSITION_TIMEOUT_S``. It also resets a sole
remaining member (op 24 with epoch 1, op 21 with transition 0) and downgrades to protocol version 0 while a member
without DAVE is in the channel (op 21/22), upgrading again (op 24) when they leave.

A :class:`DaveListener` is a second member: a ``davey.DaveSession`` driven by the same frames a client receives,
which decrypts and decodes what the bot sends, so a test hears the bot as another person in the channel would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import davey
import discord.opus
import numpy as np

from . import mls

log = logging.getLogger(__name__)

DAVE_VERSION = 1  # the protocol version the stand-in speaks
TRANSITION_TIMEOUT_S = 30.0  # execute a transition after this even if a member never said it was ready (Discord times
# transitions out too; 2 s made a test fail on a loaded machine, where the bot said it was ready later than that)
OP_SESSION_DESCRIPTION, OP_CLIENTS_CONNECT, OP_CLIENT_DISCONNECT = 4, 11, 13
OP_PREPARE_TRANSITION, OP_EXECUTE_TRANSITION, OP_TRANSITION_READY, OP_PREPARE_EPOCH = 21, 22, 23, 24
OP_EXTERNAL_SENDER, OP_KEY_PACKAGE, OP_PROPOSALS, OP_COMMIT_WELCOME = 25, 26, 27, 28
OP_ANNOUNCE_COMMIT, OP_WELCOME, OP_INVALID_COMMIT_WELCOME = 29, 30, 31
APPEND, REVOKE = 0, 1  # op 27 operation types
DAVE_MAGIC = b"\xfa\xfa"  # the last two bytes of every DAVE media frame (protocol frame check)


def is_dave_frame(payload: bytes) -> bool:
    """Whether a media payload carries DAVE's trailer (else it is plain Opus, sent in passthrough)."""
    return len(payload) > 2 and payload.endswith(DAVE_MAGIC)


@dataclass(frozen=True)
class _Proposal:
    """One proposal the gateway signed: Add (``key_package``) or Remove (``leaf``), about ``user_id``."""

    ref: bytes
    message: bytes
    user_id: int
    key_package: mls.KeyPackage | None = None
    leaf: int | None = None


@dataclass
class Transition:
    """A protocol transition: an epoch change (commit) or a protocol version change (downgrade)."""

    id: int
    version: int
    epoch: int
    participants: set[int]  # user ids told about it
    waiting: set[int]  # user ids not ready yet
    committer: int | None = None  # whose commit it announces (None: a version change)
    executed_at: float | None = None  # time.monotonic()


class DaveMember:
    """A member of a voice channel's media session as the gateway sees it; subclasses deliver the frames.

    ``max_version`` is what the member advertised (``max_dave_protocol_version``); 0 means no DAVE.
    """

    def __init__(self, user_id: int, max_version: int) -> None:
        self.user_id = user_id
        self.max_version = max_version
        self.key_package: mls.KeyPackage | None = None
        self.leaf: int | None = None  # leaf index in the established group
        self.stale = False  # in the group, but lost its state (re-keyed or flagged a commit): remove and re-add
        self.sent: dict[bytes, _Proposal] = {}  # proposals this member holds for its current (local) group
        self._seq = 0

    async def send_json(self, op: int, data: dict[str, Any]) -> None:
        """Deliver a JSON opcode."""
        raise NotImplementedError

    async def send_binary(self, op: int, payload: bytes) -> None:
        """Deliver a binary opcode (the sequence number is added here)."""
        self._seq = (self._seq + 1) % 65536
        await self._deliver(struct.pack(">HB", self._seq, op) + payload)

    async def _deliver(self, frame: bytes) -> None:
        raise NotImplementedError


class DaveGroup:
    """The gateway side of DAVE for one voice channel (see the module docstring).

    Parameters
    ----------
    channel_id
        The voice channel; its id is the MLS group id members use.
    """

    def __init__(self, channel_id: int) -> None:
        self.channel_id = channel_id
        self.group_id = channel_id.to_bytes(8, "big")
        self.sender = mls.ExternalSender()
        self.version = DAVE_VERSION
        self.epoch = 0  # 0 while no group is established
        self.members: dict[int, DaveMember] = {}
        self.leaves: dict[int, int] = {}  # leaf index -> user id, in the established group
        self.inflight: dict[tuple[str, Any], _Proposal] = {}  # established group: ("add", kp ref) / ("remove", leaf)
        self.transitions: list[Transition] = []
        self.errors: list[str] = []  # every message the gateway refused, one line each
        self.superseded = 0  # commits that arrived after another member's commit for the same epoch
        self.commits: list[mls.Commit] = []  # every commit announced, in order
        self._pending: dict[int, Transition] = {}  # by transition id, until executed
        self._announced: set[int] = set()  # epochs whose commit has been announced (in this group)
        self._initial_adds: dict[bytes, _Proposal] = {}  # KeyPackageRef -> its Add, while no group is established
        self._next_transition = 0
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._timers: set[asyncio.Task[None]] = set()

    @property
    def established(self) -> bool:
        """Whether an MLS group exists (a first commit has been announced)."""
        return self.epoch > 0

    def version_for(self, max_version: int) -> int:
        """The protocol version a member advertising ``max_version`` is told in op 4."""
        return self.version if max_version >= DAVE_VERSION else 0

    # ---- events from members -----------------------------------------------------------------------------------

    async def join(self, member: DaveMember) -> None:
        """A member has been sent op 4: tell the others, send it the external sender, propose it when ready."""
        async with self._lock:
            old = self.members.get(member.user_id)
            if old is not None:
                await self._drop(old)
            self.members[member.user_id] = member
            others = [m for m in self.members.values() if m is not member]
            await member.send_json(OP_CLIENTS_CONNECT, {"user_ids": [str(m.user_id) for m in others]})
            for m in others:
                await m.send_json(OP_CLIENTS_CONNECT, {"user_ids": [str(member.user_id)]})
            if member.max_version < DAVE_VERSION:
                if self.version >= DAVE_VERSION:
                    await self._downgrade()
            elif self.version >= DAVE_VERSION:
                await member.send_binary(OP_EXTERNAL_SENDER, self.sender.package())
            await self._reconcile()

    async def leave(self, member: DaveMember) -> None:
        """A member disconnected from the media session."""
        async with self._lock:
            if self.members.get(member.user_id) is member:
                await self._drop(member)
                await self._reconcile()

    async def receive_binary(self, member: DaveMember, frame: bytes) -> None:
        """A binary frame from a member (opcode byte, then the payload)."""
        async with self._lock:
            if not frame:
                return self._refuse(member, "an empty binary frame")
            op, payload = frame[0], frame[1:]
            if self.members.get(member.user_id) is not member:
                return self._refuse(member, f"binary op {op} from a member no longer in the session")
            if op == OP_KEY_PACKAGE:
                await self._key_package(member, payload)
            elif op == OP_COMMIT_WELCOME:
                await self._commit_welcome(member, payload)
            else:
                return self._refuse(member, f"unexpected binary op {op}")
            await self._reconcile()

    async def receive_json(self, member: DaveMember, op: int, data: dict[str, Any]) -> None:
        """A JSON DAVE opcode from a member (23 ready for transition, 31 invalid commit or welcome)."""
        async with self._lock:
            if self.members.get(member.user_id) is not member:
                return
            if op == OP_TRANSITION_READY:
                await self._ready(member, int(data.get("transition_id", -1)))
            elif op == OP_INVALID_COMMIT_WELCOME:
                log.info("stand-in DAVE: user %s flagged transition %s invalid", member.user_id,
                         data.get("transition_id"))
                member.stale = member.leaf is not None
                member.key_package = None
                member.sent.clear()
                await self._reconcile()

    # ---- what tests inject -------------------------------------------------------------------------------------

    async def send_raw(self, user_id: int, op: int, payload: bytes) -> None:
        """Send any binary opcode to a member, bypassing every check (malformed input for the bot)."""
        await self.members[user_id].send_binary(op, payload)

    def sign_proposal(self, body: bytes, epoch: int | None = None) -> tuple[bytes, bytes]:
        """Frame and sign a proposal with the gateway's key for this group (current epoch by default)."""
        return self.sender.proposal(self.group_id, self.epoch if epoch is None else epoch, body)

    async def wait_for(self, condition: Any, timeout: float = 10.0, what: str = "condition") -> None:
        """Wait until ``condition()`` is true, woken on every change of the group."""
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError(f"DAVE group of channel {self.channel_id}: {what} within {timeout} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except asyncio.TimeoutError:
                pass

    def open_media(self, sender_id: int, seq: int, payload: bytes) -> tuple[bytes, bool]:
        """Forward a sender's media frame to every listening member (as the SFU does); the Opus the first DAVE
        listener decrypted, and whether the frame was end-to-end encrypted.

        Raises ``ValueError`` for an encrypted frame the first listener cannot decrypt (or no listener to do so).
        """
        listeners = [m for m in self.members.values() if isinstance(m, DaveListener) and m.user_id != sender_id]
        listeners.sort(key=lambda m: m.max_version < DAVE_VERSION)  # a DAVE member first
        heard = [m.receive_media(sender_id, seq, payload) for m in listeners]
        e2ee = is_dave_frame(payload)
        if heard and heard[0].opus is not None:
            return heard[0].opus, e2ee
        if not e2ee:
            return payload, False
        who = f"listener {listeners[0].user_id}" if listeners else "no listener"
        raise ValueError(f"{who} cannot decrypt a DAVE frame from user {sender_id}")

    def executed(self) -> list[Transition]:
        """The transitions executed so far, in order."""
        return [t for t in self.transitions if t.executed_at is not None]

    async def close(self) -> None:
        """Cancel pending transition timers and stop the listeners."""
        for task in list(self._timers):
            task.cancel()
        for member in list(self.members.values()):
            if isinstance(member, DaveListener):
                await member.stop()

    # ---- handling ----------------------------------------------------------------------------------------------

    def _refuse(self, member: DaveMember, what: str) -> None:
        """Record and log one refused message."""
        line = f"user {member.user_id}: {what}"
        self.errors.append(line)
        log.info("stand-in DAVE refused: %s", line)
        self._changed.set()

    async def _drop(self, member: DaveMember) -> None:
        """Forget a member; tell the others it left."""
        del self.members[member.user_id]
        for m in self.members.values():
            await m.send_json(OP_CLIENT_DISCONNECT, {"user_id": str(member.user_id)})
        for t in list(self._pending.values()):
            t.waiting.discard(member.user_id)
            await self._maybe_execute(t)
        if member.max_version < DAVE_VERSION and self.version == 0:
            if all(m.max_version >= DAVE_VERSION for m in self.members.values()):
                await self._upgrade()

    async def _key_package(self, member: DaveMember, payload: bytes) -> None:
        if self.version < DAVE_VERSION:
            return self._refuse(member, "a key package while the session runs protocol version 0")
        try:
            kp = mls.parse_key_package(payload)
        except mls.MlsError as e:
            return self._refuse(member, f"key package: {e}")
        if kp.leaf.user_id != member.user_id:
            return self._refuse(member, f"key package for user {kp.leaf.user_id}")
        if kp.leaf.lifetime != mls.LIFETIME_MAX:
            return self._refuse(member, f"key package lifetime {kp.leaf.lifetime}")
        # a new key package means the member reset its local MLS state
        member.key_package = kp
        member.sent.clear()
        if member.leaf is not None:
            member.stale = True

    async def _commit_welcome(self, member: DaveMember, payload: bytes) -> None:
        try:
            commit, welcome = mls.parse_commit_welcome(payload)
        except mls.MlsError as e:
            return self._refuse(member, f"commit: {e}")
        if commit.group_id == self.group_id and commit.epoch in self._announced:
            self.superseded += 1  # it lost the race: the gateway announces the first commit of an epoch only
            return
        if commit.group_id != self.group_id or commit.epoch != self.epoch:
            return self._refuse(member, f"commit for epoch {commit.epoch} (the group is at {self.epoch})")
        expected = self._inflight_for(member)
        if self.established and (member.leaf is None or member.stale or commit.sender_leaf != member.leaf):
            return self._refuse(member, f"commit from leaf {commit.sender_leaf}, not a member's")
        if commit.inline_proposals or set(commit.proposal_refs) != set(expected):
            return self._refuse(member, "commit that does not cite exactly the proposals in flight")
        if commit.path_leaf is not None and commit.path_leaf.user_id != member.user_id:
            return self._refuse(member, "commit that changes the committer's credential")
        adds = [expected[r] for r in commit.proposal_refs if expected[r].key_package is not None]
        welcomes: dict[int, bytes] = {}
        for p in adds:
            assert p.key_package is not None
            part = welcome.for_member(p.key_package.ref) if welcome is not None else None
            if part is None:
                return self._refuse(member, f"commit adds user {p.user_id} without a welcome for them")
            welcomes[p.user_id] = part
        await self._announce(member, commit, [expected[r] for r in commit.proposal_refs], welcomes)

    def _inflight_for(self, member: DaveMember) -> dict[bytes, _Proposal]:
        """The proposals a commit from ``member`` must cite, by reference."""
        if self.established:
            return {p.ref: p for p in self.inflight.values()}
        return dict(member.sent)

    async def _announce(self, committer: DaveMember, commit: mls.Commit, proposals: list[_Proposal],
                        welcomes: dict[int, bytes]) -> None:
        """Op 29 to the group's members, op 30 to each new member; the group moves to the next epoch."""
        leaves = dict(self.leaves) if self.established else {0: committer.user_id}
        removed = {p.leaf for p in proposals if p.leaf is not None}
        for leaf in removed:
            leaves.pop(leaf, None)
        for p in proposals:
            if p.key_package is not None:
                leaves[min(set(range(len(leaves) + 1)) - set(leaves))] = p.user_id  # leftmost free leaf
        old_members = set(self.leaves.values()) if self.established else {committer.user_id}
        stay = {uid for leaf, uid in leaves.items() if uid in old_members and uid not in welcomes}
        self._announced.add(commit.epoch)
        self._initial_adds.clear()
        self.epoch = commit.epoch + 1
        self.leaves = leaves
        self.inflight.clear()
        for m in self.members.values():
            m.sent.clear()
            m.leaf = next((leaf for leaf, uid in leaves.items() if uid == m.user_id), None)
            if m.user_id in welcomes:
                m.stale, m.key_package = False, None  # welcomed: its key package is used up
        transition = self._new_transition(self.version, stay | set(welcomes))
        transition.committer = committer.user_id
        self.commits.append(commit)
        log.info("stand-in DAVE: epoch %s (transition %s) by user %s: members %s", self.epoch, transition.id,
                 committer.user_id, sorted(leaves.values()))
        for uid in stay:
            if uid in self.members:
                await self.members[uid].send_binary(OP_ANNOUNCE_COMMIT, struct.pack(">H", transition.id) + commit.raw)
        for uid, part in welcomes.items():
            if uid in self.members:
                await self.members[uid].send_binary(OP_WELCOME, struct.pack(">H", transition.id) + part)
        self._changed.set()

    def _new_transition(self, version: int, participants: Iterable[int]) -> Transition:
        """Register a transition everyone in ``participants`` must be ready for; executes on time-out."""
        self._next_transition = self._next_transition % 65535 + 1  # 0 is reserved for (re)initialisation
        users = set(participants)
        transition = Transition(self._next_transition, version, self.epoch, users, set(users))
        self.transitions.append(transition)
        self._pending[transition.id] = transition
        task = asyncio.get_running_loop().create_task(self._time_out(transition))
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)
        return transition

    async def _time_out(self, transition: Transition) -> None:
        await asyncio.sleep(TRANSITION_TIMEOUT_S)
        async with self._lock:
            if transition.executed_at is None and transition.waiting:
                log.info("stand-in DAVE: transition %s timed out waiting for %s", transition.id,
                         sorted(transition.waiting))
                transition.waiting.clear()
                await self._maybe_execute(transition)

    async def _ready(self, member: DaveMember, transition_id: int) -> None:
        t = self._pending.get(transition_id)
        if t is None:
            return self._refuse(member, f"ready for unknown transition {transition_id}")
        t.waiting.discard(member.user_id)
        await self._maybe_execute(t)

    async def _maybe_execute(self, t: Transition) -> None:
        """Op 22 to the participants once all are ready."""
        if t.waiting or t.id not in self._pending:
            return
        del self._pending[t.id]
        t.executed_at = time.monotonic()
        for uid in t.participants:
            if uid in self.members:
                await self.members[uid].send_json(OP_EXECUTE_TRANSITION, {"transition_id": t.id})
        self._changed.set()

    async def _downgrade(self) -> None:
        """A member without DAVE joined: everyone moves to protocol version 0; the group is dropped."""
        self.version = 0
        dave_members = [m for m in self.members.values() if m.max_version >= DAVE_VERSION]
        transition = self._new_transition(0, (m.user_id for m in dave_members))
        for m in dave_members:
            await m.send_json(OP_PREPARE_TRANSITION, {"transition_id": transition.id, "protocol_version": 0})
        self._forget_group()

    async def _upgrade(self) -> None:
        """The last member without DAVE left: a new group is created for protocol version 1."""
        self.version = DAVE_VERSION
        self._forget_group()
        for m in self.members.values():
            await m.send_json(OP_PREPARE_EPOCH, {"protocol_version": self.version, "epoch": 1})
            await m.send_binary(OP_EXTERNAL_SENDER, self.sender.package())

    def _forget_group(self) -> None:
        """Back to no established group; members keep nothing the gateway proposed."""
        self.epoch, self.leaves = 0, {}
        self.inflight.clear()
        self._announced.clear()
        self._initial_adds.clear()
        for m in self.members.values():
            m.leaf, m.stale, m.key_package = None, False, None
            m.sent.clear()

    async def _sole_member_reset(self, member: DaveMember) -> None:
        """Only one member is left in an established group: it starts a new group on its own."""
        log.info("stand-in DAVE: sole member reset for user %s", member.user_id)
        self._forget_group()
        await member.send_json(OP_PREPARE_EPOCH, {"protocol_version": self.version, "epoch": 1})
        await member.send_json(OP_PREPARE_TRANSITION, {"transition_id": 0, "protocol_version": self.version})

    async def _reconcile(self) -> None:
        """Send the proposals the current membership calls for (and revoke those it no longer does)."""
        if self.version < DAVE_VERSION:
            return
        dave = [m for m in self.members.values() if m.max_version >= DAVE_VERSION]
        if self.established:
            committers = [m for m in dave if m.leaf is not None and not m.stale]
            if len(dave) == 1 and committers:
                return await self._sole_member_reset(committers[0])
            if not committers:
                self._forget_group()
            else:
                return await self._reconcile_established(committers, dave)
        for recipient in dave:
            wanted = {p.ref: p for p in (self._add(s.key_package) for s in dave if s is not recipient)
                      if p is not None}
            revoke = [ref for ref in recipient.sent if ref not in wanted]
            append = [p for ref, p in wanted.items() if ref not in recipient.sent]
            await self._send_proposals(recipient, append, revoke)

    async def _reconcile_established(self, committers: list[DaveMember], dave: list[DaveMember]) -> None:
        wanted: dict[tuple[str, Any], _Proposal] = {}
        present = {m.user_id for m in committers}
        # a member that flagged a commit sends its new key package right after; remove and re-add in one commit
        rekeying = {m.user_id for m in dave if m.stale and m.key_package is None}
        for leaf, uid in self.leaves.items():
            if uid not in present and uid not in rekeying:
                key = ("remove", leaf)
                wanted[key] = self.inflight.get(key) or self._remove(leaf, uid)
        for m in dave:
            if m.key_package is not None and (m.leaf is None or m.stale):
                key = ("add", m.key_package.ref)
                wanted[key] = self.inflight.get(key) or self._add_now(m.key_package)
        revoke = [p.ref for key, p in self.inflight.items() if key not in wanted]
        append = [p for key, p in wanted.items() if key not in self.inflight]
        self.inflight = wanted
        for m in committers:
            await self._send_proposals(m, append, revoke)

    def _add(self, kp: mls.KeyPackage | None) -> _Proposal | None:
        """The epoch-0 Add proposal for a pending member's key package: signed once, the same for every recipient
        (a new signature would make a new proposal)."""
        if kp is None:
            return None
        if kp.ref not in self._initial_adds:
            self._initial_adds[kp.ref] = self._add_now(kp)
        return self._initial_adds[kp.ref]

    def _add_now(self, kp: mls.KeyPackage) -> _Proposal:
        message, ref = self.sign_proposal(mls.add_proposal(kp))
        return _Proposal(ref, message, kp.leaf.user_id or 0, key_package=kp)

    def _remove(self, leaf: int, user_id: int) -> _Proposal:
        message, ref = self.sign_proposal(mls.remove_proposal(leaf))
        return _Proposal(ref, message, user_id, leaf=leaf)

    async def _send_proposals(self, member: DaveMember, append: list[_Proposal], revoke: list[bytes]) -> None:
        """Op 27: revocations first, then new proposals."""
        if revoke:
            for ref in revoke:
                member.sent.pop(ref, None)
            refs = b"".join(mls.vector(r) for r in revoke)
            await member.send_binary(OP_PROPOSALS, bytes([REVOKE]) + mls.vector(refs))
        if append:
            for p in append:
                member.sent[p.ref] = p
            await member.send_binary(OP_PROPOSALS, bytes([APPEND]) + mls.vector(b"".join(p.message for p in append)))


# ---- the listening member ------------------------------------------------------------------------------------------

@dataclass
class HeardFrame:
    """One media frame as a listener received it."""

    seq: int
    at: float  # time.monotonic()
    e2ee: bool  # it was end-to-end encrypted (else plain Opus, in passthrough)
    opus: bytes | None  # None: the listener could not decrypt it
    payload: bytes  # as forwarded


class DaveListener(DaveMember):
    """A second person in the voice channel, with a real ``davey.DaveSession``.

    It handles the gateway's frames the way a client does (key package on a new session or group, proposals ->
    commit, commit or welcome -> ready, execute, sole member reset, op 31 on a commit or welcome it cannot process)
    and decrypts every media frame the SFU forwards to it.

    Parameters
    ----------
    user_id, channel_id
        Who it is and where (the channel id is the MLS group id).
    dave
        False: a client without DAVE (``max_dave_protocol_version`` 0), which makes the channel downgrade.
    commits
        False: it never sends a commit of its own, so another member's commit always wins.
    """

    def __init__(self, user_id: int, channel_id: int, *, dave: bool = True, commits: bool = True) -> None:
        super().__init__(user_id, DAVE_VERSION if dave else 0)
        self.channel_id = channel_id
        self.commits = commits
        self.session: davey.DaveSession | None = None
        self.version = 0
        self.expected: set[int] = set()
        self.pending_transitions: dict[int, int] = {}
        self.frames: list[HeardFrame] = []
        self.invalid: list[str] = []  # commits or welcomes it flagged (op 31), one line each
        self._group: DaveGroup | None = None
        self._inbox: asyncio.Queue[bytes | tuple[int, dict[str, Any]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    # ---- connection --------------------------------------------------------------------------------------------

    async def connect(self, group: DaveGroup) -> None:
        """Join the group's media session: op 4 (the version the gateway picks), then the group's frames."""
        self._group = group
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self.send_json(OP_SESSION_DESCRIPTION, {"dave_protocol_version": group.version_for(self.max_version)})
        await group.join(self)

    async def disconnect(self) -> None:
        """Leave the media session."""
        if self._group is not None:
            await self._group.leave(self)
        await self.stop()

    async def stop(self) -> None:
        """Stop handling frames."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def idle(self) -> None:
        """Wait until every frame received so far has been handled."""
        await self._inbox.join()

    async def send_json(self, op: int, data: dict[str, Any]) -> None:
        self._inbox.put_nowait((op, json.loads(json.dumps(data))))

    async def _deliver(self, frame: bytes) -> None:
        self._inbox.put_nowait(frame)

    async def _run(self) -> None:
        while True:
            item = await self._inbox.get()
            try:
                if isinstance(item, bytes):
                    await self._on_binary(item[2], item[3:])
                else:
                    await self._on_json(*item)
            except Exception:
                log.exception("stand-in DAVE listener %s failed on a frame", self.user_id)
            finally:
                self._inbox.task_done()

    async def _to_gateway_binary(self, op: int, payload: bytes) -> None:
        assert self._group is not None
        await self._group.receive_binary(self, bytes([op]) + payload)

    async def _to_gateway_json(self, op: int, data: dict[str, Any]) -> None:
        assert self._group is not None
        await self._group.receive_json(self, op, data)

    # ---- the client side of the protocol -----------------------------------------------------------------------

    async def _reinit(self) -> None:
        """A new local MLS state and a key package for it."""
        if self.session is None:
            self.session = davey.DaveSession(self.version, self.user_id, self.channel_id)
        else:
            self.session.reinit(self.version, self.user_id, self.channel_id)
        await self._to_gateway_binary(OP_KEY_PACKAGE, self.session.get_serialized_key_package())

    async def _on_json(self, op: int, d: dict[str, Any]) -> None:
        if op == OP_SESSION_DESCRIPTION:
            self.version = int(d["dave_protocol_version"])
            if self.version > 0:
                await self._reinit()
        elif op == OP_CLIENTS_CONNECT:
            self.expected.update(int(u) for u in d["user_ids"])
        elif op == OP_CLIENT_DISCONNECT:
            self.expected.discard(int(d["user_id"]))
        elif self.session is None:
            return
        elif op == OP_PREPARE_TRANSITION:
            tid, version = int(d["transition_id"]), int(d["protocol_version"])
            self.pending_transitions[tid] = version
            if tid == 0:
                self._execute(0)
            else:
                await self._to_gateway_json(OP_TRANSITION_READY, {"transition_id": tid})
        elif op == OP_EXECUTE_TRANSITION:
            self._execute(int(d["transition_id"]))
        elif op == OP_PREPARE_EPOCH and int(d["epoch"]) == 1:
            self.version = int(d["protocol_version"])
            await self._reinit()

    def _execute(self, transition_id: int) -> None:
        if transition_id in self.pending_transitions:
            self.version = self.pending_transitions.pop(transition_id)

    async def _on_binary(self, op: int, payload: bytes) -> None:
        session = self.session
        if session is None:
            return
        if op == OP_EXTERNAL_SENDER:
            session.set_external_sender(payload)
        elif op == OP_PROPOSALS:
            kind = davey.ProposalsOperationType.append if payload[0] == APPEND else davey.ProposalsOperationType.revoke
            result = session.process_proposals(kind, payload[1:], sorted(self.expected))
            if result is not None and self.commits:
                await self._to_gateway_binary(OP_COMMIT_WELCOME, result.commit + (result.welcome or b""))
        elif op in (OP_ANNOUNCE_COMMIT, OP_WELCOME):
            tid = struct.unpack_from(">H", payload)[0]
            try:
                if op == OP_ANNOUNCE_COMMIT:
                    session.process_commit(payload[2:])
                else:
                    session.process_welcome(payload[2:])
            except ValueError as e:
                self.invalid.append(f"transition {tid}: {e}")
                await self._to_gateway_json(OP_INVALID_COMMIT_WELCOME, {"transition_id": tid})
                await self._reinit()
                return
            if tid != 0:
                self.pending_transitions[tid] = self.version
                await self._to_gateway_json(OP_TRANSITION_READY, {"transition_id": tid})

    # ---- media ---------------------------------------------------------------------------------------------------

    def receive_media(self, sender_id: int, seq: int, payload: bytes) -> HeardFrame:
        """Decrypt one frame from ``sender_id`` (plain frames pass through) and keep it."""
        e2ee = is_dave_frame(payload)
        opus: bytes | None = payload
        if e2ee:
            try:
                opus = None if self.session is None else self.session.decrypt(sender_id, davey.MediaType.audio, payload)
            except ValueError:  # no key for this sender and epoch
                opus = None
        frame = HeardFrame(seq, time.monotonic(), e2ee, opus, payload)
        self.frames.append(frame)
        return frame

    @property
    def epoch(self) -> int | None:
        """The epoch of the listener's MLS group (None without one)."""
        return None if self.session is None else self.session.epoch

    @property
    def ready(self) -> bool:
        """Whether its session can decrypt (it is in an established group)."""
        return self.session is not None and self.session.ready

    def pcm(self) -> np.ndarray:
        """Everything it could decrypt, Opus-decoded in arrival order: ``[samples, 2]`` int16 @ 48 kHz."""
        decoder = discord.opus.Decoder()
        raw = b"".join(decoder.decode(f.opus, fec=False) for f in self.frames if f.opus)
        return np.frombuffer(raw, dtype=np.int16).reshape(-1, 2).copy()


__all__ = ["DaveGroup", "DaveListener", "DaveMember", "HeardFrame", "Transition", "is_dave_frame"]
