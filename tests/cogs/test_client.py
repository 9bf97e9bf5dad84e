"""VoiceBot: endpoints and TLS trust from config, extensions loaded, the exact command set synced, clean close."""

from __future__ import annotations

import json
import ssl
from types import SimpleNamespace

import aiohttp
import discord
import discord.gateway
import discord.http
import pytest
import trustme
import yarl
from aiohttp import web

from bot.client import VoiceBot, ssl_context_for
from bot.config import ConfigError, config_from_dict
from tests.cogs.conftest import APP_ID, BOT_ID, FakeSpeech, FakeSynthesizer

EXPECTED_COMMANDS = {
    "join", "leave", "say", "skip", "clear", "Speak with my voice", "voice", "forget-me", "settings", "set", "phrases",
    "ask", "pronounce", "block", "stats", "help",
}
EXPECTED_VOICE_SUBCOMMANDS = {"enroll", "clone", "add-clip", "style", "use", "preview", "list", "share", "unshare",
                              "delete"}


def _json(data) -> web.Response:
    """discord.py wants the Content-Type to be exactly application/json."""
    return web.Response(body=json.dumps(data).encode(), headers={"Content-Type": "application/json"})


@pytest.fixture
async def rest(tmp_path):
    """A minimal Discord REST endpoint over TLS on 127.0.0.1, with a trustme CA written to a PEM file."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    seen: dict[str, object] = {}
    me = {"id": str(BOT_ID), "username": "voicebot", "discriminator": "0", "avatar": None, "bot": True}

    async def users_me(request):
        seen["auth"] = request.headers.get("Authorization")
        return _json(me)

    async def app_info(request):
        return _json({"id": str(APP_ID), "name": "voicebot", "icon": None, "description": "", "bot_public": True,
                      "bot_require_code_grant": False, "owner": me, "verify_key": "00", "flags": 0})

    async def sync(request):
        body = await request.json()
        seen["commands"] = body
        return _json([{"description": "", **c, "id": str(1000 + i), "application_id": str(APP_ID), "version": "1"}
                      for i, c in enumerate(body)])

    app = web.Application()
    app.router.add_get("/api/v10/users/@me", users_me)
    app.router.add_get("/api/v10/oauth2/applications/@me", app_info)
    app.router.add_put(f"/api/v10/applications/{APP_ID}/commands", sync)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield SimpleNamespace(base=f"https://127.0.0.1:{port}/api/v10", ca_file=ca_file, seen=seen)
    await runner.cleanup()


@pytest.fixture
def restore_discord_globals(monkeypatch):
    monkeypatch.setattr(discord.http.Route, "BASE", discord.http.Route.BASE)
    monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY",
                        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)


async def _services(tmp_path, **discord_cfg):
    from bot.store import Store
    from bot.voice_service import VoiceService

    config = config_from_dict({"discord": {"database": "bot.sqlite3", **discord_cfg}}, base_dir=tmp_path)
    store = Store(config.discord.database)
    await store.open()
    synthesizer = FakeSynthesizer()
    return SimpleNamespace(config=config, synthesizer=synthesizer, store=store, speech=FakeSpeech(synthesizer, store),
                           voices=VoiceService(store, synthesizer, phrases=config.phrases))


async def test_login_trusts_the_ca_and_syncs_every_command(rest, tmp_path, restore_discord_globals):
    services = await _services(tmp_path, api_base=rest.base + "/", gateway_url="ws://127.0.0.1:9/gateway",
                               ca_file=str(rest.ca_file), guild_ready_timeout_s=0.05)
    bot = VoiceBot(services)
    assert bot.intents.guilds and bot.intents.voice_states and bot.intents.guild_messages
    assert bot.intents.message_content and not bot.intents.members and not bot.intents.presences
    async with bot:
        await bot.login("secret-token")
        assert discord.http.Route.BASE == rest.base
        assert discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY == yarl.URL("ws://127.0.0.1:9/gateway")
        assert rest.seen["auth"] == "Bot secret-token"
        assert bot.extensions_failed == {}
        assert sorted(bot.extensions_loaded) == ["cogs.blocks", "cogs.chat", "cogs.help", "cogs.phrases",
                                                "cogs.pronounce", "cogs.settings", "cogs.speech", "cogs.stats",
                                                "cogs.voices"]
        synced = {c["name"]: c for c in rest.seen["commands"]}
        assert set(synced) == EXPECTED_COMMANDS
        assert {o["name"] for o in synced["voice"]["options"]} == EXPECTED_VOICE_SUBCOMMANDS
        assert {o["name"] for o in synced["phrases"]["options"]} == {"add", "list", "remove"}
        assert {o["name"] for o in synced["set"]["options"]} == {"guild", "user", "bot-voice"}
        assert synced["Speak with my voice"]["type"] == 3  # a message context menu
        assert bot._connection.guild_ready_timeout == 0.05
    assert services.speech.calls == [("shutdown",)]  # close() stops speech first
    await services.store.close()


async def test_without_the_ca_tls_is_refused(rest, tmp_path, restore_discord_globals):
    services = await _services(tmp_path, api_base=rest.base)
    async with VoiceBot(services) as bot:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await bot.login("secret-token")
    await services.store.close()


def test_missing_ca_file_is_a_config_error(tmp_path):
    config = config_from_dict({"discord": {"ca_file": "nope.pem"}}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="discord.ca_file"):
        ssl_context_for(config.discord)


async def test_a_broken_extension_is_logged_and_the_rest_load(tmp_path, caplog):
    services = await _services(tmp_path)
    bot = VoiceBot(services, extensions=["cogs.nonexistent", "cogs.phrases"], sync_commands=False)
    await bot._async_setup_hook()
    await bot.setup_hook()
    assert bot.extensions_loaded == ["cogs.phrases"] and list(bot.extensions_failed) == ["cogs.nonexistent"]
    assert "could not load extension cogs.nonexistent" in caplog.text
    await bot.close()
    await services.store.close()
