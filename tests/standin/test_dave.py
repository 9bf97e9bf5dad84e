"""The stand-in's DAVE gateway and MLS encoding on their own: davey members only, no bot, no sockets."""

from __future__ import annotations

import davey
import pytest

from . import mls
from .dave import DaveGroup, DaveListener

CHANNEL = 1_234_567_890_123
ALICE, BOB, CAROL = 101, 202, 303


def test_vector_lengths_are_minimal_and_round_trip() -> None:
    for n in (0, 63, 64, 16383, 16384, 70000):
        data = bytes(n % 251 for _ in range(n))
        encoded = mls.vector(data)
        assert len(encoded) - n == (1 if n < 64 else 2 if n < 16384 else 4)
        assert mls.Reader(encoded).vector() == data
    with pytest.raises(mls.MlsError, match="not minimally encoded"):
        mls.Reader(b"\x40\x05hello").vector()
    with pytest.raises(mls.MlsError, match="truncated"):
        mls.Reader(b"\x05hel").vector()


def test_key_packages_are_parsed_and_their_signature_checked() -> None:
    raw = davey.DaveSession(1, ALICE, CHANNEL).get_serialized_key_package()
    kp = mls.parse_key_package(raw)
    assert kp.leaf.user_id == ALICE and kp.leaf.lifetime == mls.LIFETIME_MAX and len(kp.ref) == 32
    tampered = bytearray(raw)
    tampered[10] ^= 1  # inside the init key, which the signature covers
    with pytest.raises(mls.MlsError, match="bad key package signature"):
        mls.parse_key_package(bytes(tampered))
    with pytest.raises(mls.MlsError, match="truncated"):
        mls.parse_key_package(raw[:-3])


def test_external_proposals_and_commits_are_what_davey_accepts() -> None:
    sender = mls.ExternalSender()
    group_id = CHANNEL.to_bytes(8, "big")
    a, b = davey.DaveSession(1, ALICE, CHANNEL), davey.DaveSession(1, BOB, CHANNEL)
    kp_b = mls.parse_key_package(b.get_serialized_key_package())
    a.set_external_sender(sender.package())
    b.set_external_sender(sender.package())
    message, ref = sender.proposal(group_id, 0, mls.add_proposal(kp_b))
    result = a.process_proposals(davey.ProposalsOperationType.append, mls.vector(message), [BOB])
    assert result is not None and result.welcome is not None
    commit, welcome = mls.parse_commit_welcome(result.commit + result.welcome)
    assert (commit.epoch, commit.sender_leaf, commit.group_id) == (0, 0, group_id)
    assert commit.proposal_refs == (ref,) and commit.raw == result.commit  # the gateway's ref is the member's
    assert welcome is not None and welcome.refs == [kp_b.ref]
    a.process_commit(commit.raw)
    b.process_welcome(welcome.for_member(kp_b.ref) or b"")
    assert (a.epoch, b.epoch, b.own_leaf_index) == (1, 1, 1)
    assert b.decrypt(ALICE, davey.MediaType.audio, a.encrypt_opus(b"\xfc" + bytes(40))) == b"\xfc" + bytes(40)


async def test_group_forms_grows_shrinks_and_resets() -> None:
    group = DaveGroup(CHANNEL)
    alice, bob = DaveListener(ALICE, CHANNEL), DaveListener(BOB, CHANNEL)
    try:
        await alice.connect(group)
        await bob.connect(group)
        await group.wait_for(lambda: len(group.executed()) == 1 and alice.ready and bob.ready, 5, "a group")
        assert group.epoch == 1 and sorted(group.leaves.values()) == [ALICE, BOB]

        carol = DaveListener(CAROL, CHANNEL, commits=False)
        await carol.connect(group)
        await group.wait_for(lambda: len(group.executed()) == 2 and carol.ready, 5, "carol added")
        assert {alice.epoch, bob.epoch, carol.epoch} == {2}
        assert group.executed()[-1].committer in (ALICE, BOB)

        await carol.disconnect()
        await group.wait_for(lambda: len(group.executed()) == 3, 5, "carol removed")
        assert sorted(group.leaves.values()) == [ALICE, BOB] and alice.epoch == 3

        await bob.disconnect()  # alice alone: op 24 (epoch 1) and op 21 (transition 0), a new pending group
        await group.wait_for(lambda: not alice.ready, 5, "the sole member reset")
        await alice.idle()
        assert group.epoch == 0 and alice.key_package is not None and group.errors == []
    finally:
        await group.close()


async def test_gateway_refuses_bad_key_packages_and_stale_commits() -> None:
    group = DaveGroup(CHANNEL)
    alice, bob = DaveListener(ALICE, CHANNEL), DaveListener(BOB, CHANNEL)
    try:
        await alice.connect(group)
        await bob.connect(group)
        await group.wait_for(lambda: len(group.executed()) == 1, 5, "a group")
        someone_else = davey.DaveSession(1, CAROL, CHANNEL).get_serialized_key_package()
        await group.receive_binary(alice, bytes([26]) + someone_else)
        await group.receive_binary(alice, bytes([26]) + b"\x00\x01\x00\x02\x05")
        await group.receive_binary(alice, bytes([28]) + group.commits[0].raw)  # epoch 0 again: lost the race
        raw = group.commits[0].raw
        epoch_at = 4 + 1 + 8  # after version, wire format and the 8-byte group id with its length
        await group.receive_binary(alice, bytes([28]) + raw[:epoch_at] + mls.u64(5) + raw[epoch_at + 8 :])
        assert group.errors[0] == f"user {ALICE}: key package for user {CAROL}"
        assert group.errors[1].startswith(f"user {ALICE}: key package: truncated")
        assert len(group.errors) == 3 and "commit for epoch 5 (the group is at 1)" in group.errors[2]
        assert group.epoch == 1 and alice.ready and bob.ready
    finally:
        await group.close()


async def test_a_client_without_dave_downgrades_the_channel_until_it_leaves() -> None:
    group = DaveGroup(CHANNEL)
    alice, bob = DaveListener(ALICE, CHANNEL), DaveListener(BOB, CHANNEL)
    old = DaveListener(CAROL, CHANNEL, dave=False)
    try:
        await alice.connect(group)
        await bob.connect(group)
        await group.wait_for(lambda: len(group.executed()) == 1, 5, "a group")
        await old.connect(group)
        await group.wait_for(lambda: len(group.executed()) == 2, 5, "the downgrade")
        await alice.idle()
        assert (group.version, group.executed()[-1].version, alice.version, old.version) == (0, 0, 0, 0)
        await old.disconnect()
        await group.wait_for(lambda: len(group.executed()) == 3, 5, "the upgrade")
        await alice.idle()
        assert (group.version, group.epoch, alice.version, alice.epoch) == (1, 1, 1, 1) and group.errors == []
    finally:
        await group.close()
