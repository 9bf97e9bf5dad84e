"""A voice client that survives bad DAVE (end-to-end encryption) input from the voice gateway.

discord.py 2.7 handles DAVE's MLS opcodes in ``DiscordVoiceWebSocket.received_binary_message``. Two gaps there:

- A proposal, external sender package or frame it cannot parse raises out of the voice poller task, which then
  ends: the connection keeps sending audio but no longer reads its WebSocket, so the next member who joins is never
  added to the group and cannot hear the bot. Here the error is logged in one line and the session recovers the way
  DAVE prescribes for a bad commit or welcome: op 31 (invalid commit/welcome) and a new key package, after which the
  gateway removes and re-adds the bot.
- Add proposals are processed without the list of users known to be in the call, so the bot would commit a
  proposal for a stranger. DAVE requires members to refuse those; here the users announced by ops 11 and 13
  (clients connect / disconnect) are passed to davey, which refuses the rest.

Use with ``channel.connect(cls=DaveVoiceClient)``.
"""

from __future__ import annotations

import logging
from typing import Any

import discord
from discord.gateway import DiscordVoiceWebSocket
from discord.utils import MISSING
from discord.voice_state import ConnectionFlowState, VoiceConnectionState

log = logging.getLogger(__name__)

try:
    import davey
except ImportError:  # discord.py then advertises DAVE version 0 and none of this runs
    davey = None  # type: ignore[assignment]


class _DaveWebSocket(DiscordVoiceWebSocket):
    """The voice WebSocket with MLS errors contained and proposals checked against the call's members."""

    _members: set[int] | None = None  # user ids in the call per ops 11/13; None until the gateway sends op 11

    async def received_message(self, msg: dict[str, Any]) -> None:
        op, data = msg.get("op"), msg.get("d") or {}
        if op == self.CLIENTS_CONNECT:
            self._members = (self._members or set()) | {int(u) for u in data.get("user_ids", [])}
        elif op == self.CLIENT_DISCONNECT and self._members is not None:
            self._members.discard(int(data.get("user_id", 0)))
        await super().received_message(msg)

    async def received_binary_message(self, msg: bytes) -> None:
        op = msg[2] if len(msg) > 2 else None
        try:
            if op == self.MLS_PROPOSALS and self._connection.dave_session is not None:
                await self._process_proposals(msg)
            else:
                await super().received_binary_message(msg)
        except Exception as e:  # davey raises ValueError; a short frame IndexError or struct.error
            log.warning("DAVE: could not process voice gateway opcode %s (%s); rejoining the end-to-end group", op, e)
            await VoiceConnectionState._recover_from_invalid_commit(self._connection, 0)

    async def _process_proposals(self, msg: bytes) -> None:
        """discord.py's op 27 handling, with the users expected in the call."""
        self.seq_ack = int.from_bytes(msg[:2], "big")
        session = self._connection.dave_session
        assert session is not None and davey is not None
        kind = davey.ProposalsOperationType.append if msg[3] == 0 else davey.ProposalsOperationType.revoke
        expected = None if self._members is None else sorted(self._members | {self._connection.user.id})
        try:
            result = session.process_proposals(kind, msg[4:], expected)
        except ValueError as e:
            if "UnexpectedUser" not in str(e):
                raise
            log.warning("DAVE: refused a proposal for a user who is not in the call (%s)", e)
            return
        if result is not None:
            await self.send_binary(self.MLS_COMMIT_WELCOME, result.commit + (result.welcome or b""))


class _DaveConnectionState(VoiceConnectionState):
    """Connects with :class:`_DaveWebSocket` instead of discord.py's own class."""

    async def _recover_from_invalid_commit(self, transition_id: int) -> None:
        # discord.py calls this, silently, for a commit or welcome davey refused
        log.warning("DAVE: the voice gateway's commit or welcome for transition %d could not be processed; "
                    "rejoining the end-to-end group", transition_id)
        await super()._recover_from_invalid_commit(transition_id)

    async def _connect_websocket(self, resume: bool) -> DiscordVoiceWebSocket:
        # the same steps as discord.py 2.7's VoiceConnectionState._connect_websocket, with the subclass
        seq_ack = -1 if self.ws is MISSING else self.ws.seq_ack
        ws = await _DaveWebSocket.from_connection_state(self, resume=resume, hook=self.hook, seq_ack=seq_ack)
        self.state = ConnectionFlowState.websocket_connected
        return ws


class DaveVoiceClient(discord.VoiceClient):
    """``discord.VoiceClient`` whose voice WebSocket contains bad DAVE input (see the module docstring)."""

    def create_connection_state(self) -> VoiceConnectionState:
        return _DaveConnectionState(self)


__all__ = ["DaveVoiceClient"]
