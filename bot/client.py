"""The discord.py client: points discord.py at the configured endpoints, loads the cogs, syncs slash commands.

The bot holds no per-guild state itself; everything it needs arrives as one :class:`bot.services.Services`
(constructor injection, as discord.py's ``examples/advanced_startup.py``). Commands live in ``cogs/``.
"""

from __future__ import annotations

import importlib
import logging
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import discord
import discord.gateway
import discord.http
import yarl
from discord.ext import commands

from synthesis import SpeechError

from bot.config import ConfigError, DiscordConfig

if TYPE_CHECKING:
    from bot.services import Services

__all__ = ("VoiceBot", "ssl_context_for", "check_token")

log = logging.getLogger(__name__)

# The package whose ``EXTENSIONS`` lists the cog extensions. Loaded by name at runtime, as discord.py loads the
# extensions themselves, so that bot/ never imports cog code (imports point cogs -> bot).
EXTENSIONS_PACKAGE = "cogs"


def ssl_context_for(cfg: DiscordConfig) -> ssl.SSLContext:
    """The TLS context for every connection to Discord (REST, gateway, voice gateway).

    It trusts the system CAs and, when ``discord.ca_file`` is set, that PEM bundle as well (a proxy's CA, or the
    local stand-in's test CA).

    Raises
    ------
    ConfigError
        ``discord.ca_file`` names a missing or unreadable file.
    """
    ctx = ssl.create_default_context()
    if cfg.ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=str(cfg.ca_file))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"config key discord.ca_file: cannot load CA bundle {cfg.ca_file} ({e}); "
                "point it at a readable PEM file or set it to null"
            ) from e
    return ctx


TOKEN_CHECK_TIMEOUT_S = 15.0  # seconds to wait for Discord's answer about the token
# Application flags (GET /applications/@me): the Message Content intent is on when either is set (LIMITED: a bot in
# under 100 servers that switched it on in the portal; the other: a verified bot approved for it).
APP_FLAG_GATEWAY_MESSAGE_CONTENT = 1 << 18
APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 19
MESSAGE_CONTENT_OFF = (
    "the Message Content intent is off for this bot, and auto-read needs it: turn it on (Discord developer portal -> "
    "your application -> Bot -> Privileged Gateway Intents -> Message Content Intent), then start again"
)


def _token_refused(cfg: DiscordConfig) -> ConfigError:
    return ConfigError(f"Discord refused the token in {cfg.token_env}: copy it again from the developer portal "
                       "(your application -> Bot -> Reset Token)")


def _unreachable(cfg: DiscordConfig, e: BaseException) -> SpeechError:
    reason = str(e) or type(e).__name__
    return SpeechError(f"cannot reach Discord at {cfg.api_base} ({reason}): check the network connection "
                       "(or discord.api_base in config.yaml)")


async def check_token(cfg: DiscordConfig, token: str) -> None:
    """Ask Discord whether ``token`` is a bot token it accepts (``GET /users/@me``) and whether its application has
    the Message Content intent (``GET /applications/@me``, its ``flags``): two requests, before any model loads.

    Raises
    ------
    ConfigError
        Discord refused the token (the message names the environment variable), or the Message Content intent is
        off (the message says where to switch it on).
    SpeechError
        Discord could not be reached, or answered with an error.
    """
    base = cfg.api_base.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=TOKEN_CHECK_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await _get_json(session, cfg, base + "/users/@me", token)
            app = await _get_json(session, cfg, base + "/applications/@me", token)
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise _unreachable(cfg, e) from None
    flags = app.get("flags") if isinstance(app, dict) else None
    if not isinstance(flags, int):
        raise SpeechError(f"Discord's answer at {base}/applications/@me has no application flags; try again later")
    if not flags & (APP_FLAG_GATEWAY_MESSAGE_CONTENT | APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED):
        raise ConfigError(MESSAGE_CONTENT_OFF)


async def _get_json(session: aiohttp.ClientSession, cfg: DiscordConfig, url: str, token: str) -> Any:
    """One authorised GET; the token refused or another error status as one-line errors."""
    async with session.get(url, headers={"Authorization": f"Bot {token}"}, ssl=ssl_context_for(cfg)) as resp:
        if resp.status == 401:
            raise _token_refused(cfg)
        if resp.status >= 400:
            raise SpeechError(f"Discord answered {resp.status} {resp.reason} to the token check at {url}; "
                              "try again later")
        try:
            return await resp.json(content_type=None)
        except ValueError:
            raise SpeechError(f"Discord's answer at {url} is not JSON; check discord.api_base in config.yaml") from None


def _intents() -> discord.Intents:
    """Guilds, voice states and guild messages with their content (auto-read); no privileged members intent."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.voice_states = True
    intents.guild_messages = True
    intents.message_content = True
    return intents


class VoiceBot(commands.Bot):
    """The voicebot Discord client.

    Parameters
    ----------
    services : Services
        The process's shared services (config, synthesizer, store, speech).
    extensions : Sequence[str] or None
        Dotted module names of the cog extensions to load in :meth:`setup_hook`; by default ``cogs.EXTENSIONS``.
    sync_commands : bool
        Whether to sync the global application commands at startup.
    """

    services: Services
    extensions_loaded: list[str]
    extensions_failed: dict[str, BaseException]

    def __init__(
        self,
        services: Services,
        *,
        extensions: Sequence[str] | None = None,
        sync_commands: bool = True,
    ) -> None:
        super().__init__(
            command_prefix=commands.when_mentioned,  # no prefix commands exist; slash commands only
            help_command=None,
            intents=_intents(),
            guild_ready_timeout=services.config.discord.guild_ready_timeout_s,
            allowed_mentions=discord.AllowedMentions.none(),  # reading names aloud must never ping anyone
        )
        self.services = services
        self._extensions = tuple(extensions) if extensions is not None else None
        self._sync_commands = sync_commands
        self.extensions_loaded = []
        self.extensions_failed = {}
        self._shutdown_done = False

    async def login(self, token: str) -> None:
        """Point discord.py at the configured endpoints and TLS trust, then log in.

        This cannot wait for :meth:`setup_hook`: discord.py calls that only after ``HTTPClient.static_login`` has
        already made its first request, and the connector must exist (inside the running loop) before it.
        """
        cfg = self.services.config.discord
        discord.http.Route.BASE = cfg.api_base.rstrip("/")
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(cfg.gateway_url)
        connector = self.http.connector
        if connector is discord.utils.MISSING or connector.closed:
            self.http.connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context_for(cfg))
        try:
            await super().login(token)
        except discord.LoginFailure:
            raise _token_refused(cfg) from None
        except aiohttp.ClientSSLError:
            raise  # a TLS trust problem (discord.ca_file) is not "unreachable"; check_token words it for the CLI
        except (aiohttp.ClientConnectionError, OSError, TimeoutError) as e:
            raise _unreachable(cfg, e) from None

    async def start(self, token: str, *, reconnect: bool = True) -> None:
        """Log in and run; the gateway's refusal of the Message Content intent (close code 4014) is one line."""
        try:
            await super().start(token, reconnect=reconnect)
        except discord.PrivilegedIntentsRequired:
            raise ConfigError(MESSAGE_CONTENT_OFF) from None

    async def setup_hook(self) -> None:
        """Load every cog extension (a failure is logged by name and the rest still load), then sync commands."""
        names = self._extensions
        if names is None:
            names = tuple(importlib.import_module(EXTENSIONS_PACKAGE).EXTENSIONS)
        for name in names:
            try:
                await self.load_extension(name)
            except Exception as e:
                log.exception("could not load extension %s; its commands are unavailable", name)
                self.extensions_failed[name] = e
            else:
                self.extensions_loaded.append(name)
        if self._sync_commands:
            try:
                synced = await self.tree.sync()
            except discord.HTTPException:
                log.exception("could not sync application commands; the previously synced set stays active")
            else:
                log.info("synced %d application commands", len(synced))

    async def on_message(self, message: discord.Message, /) -> None:
        """Do nothing here: there are no prefix commands (cog listeners still receive every message)."""

    async def on_ready(self) -> None:
        """Log who we are once the guilds have arrived."""
        assert self.user is not None
        log.info("logged in as %s (%s) in %d guilds", self.user, self.user.id, len(self.guilds))

    async def close(self) -> None:
        """Stop speech first (journals the queues, leaves voice), then close the Discord connection."""
        if not self._shutdown_done:
            self._shutdown_done = True
            speech = self.services.speech
            if speech is not None:
                try:
                    await speech.shutdown()
                except Exception:
                    log.exception("speech shutdown failed; closing the Discord connection anyway")
        await super().close()
