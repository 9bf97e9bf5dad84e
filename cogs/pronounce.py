"""``/pronounce add|remove|list|check|export|import``: fix how a word is read, for the server or for yourself.

An entry is a word or phrase and either a respelling (``Nguyen`` -> ``win``) or phones (``W IH1 N``, pinyin
``chang2``). The server's dictionary needs Manage Server to change; ``mine:true`` edits the member's own, which
applies to their messages everywhere, on top of the server's. Adding an entry says how the word will be read, and
speaks it in the voice channel when the bot is in the member's.
"""

from __future__ import annotations

import io
import logging
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.pronunciations import Pronunciations, explain_phonemes, format_explanation
from cogs.base import MAX_CHOICES, ReplyingCog, UsageError, guild_member, is_admin, send_ephemeral

if TYPE_CHECKING:
    from bot import VoiceBot

log = logging.getLogger(__name__)

MAX_IMPORT_BYTES = 1024 * 1024  # a dictionary file (synthesis' limit too: 2,000 entries fit)
MAX_REPLY_CHARS = 2000  # Discord's message limit
LANG_CHOICES = [app_commands.Choice(name=n, value=v) for n, v in (
    ("English (ARPAbet: W IH1 N)", "en"), ("Chinese (pinyin: chang2 cheng2)", "zh"),
    ("Japanese (OpenJTalk: k o N n i ch i w a)", "ja"), ("Korean (jamo)", "ko"), ("Cantonese (Y-phones)", "yue"))]


class PronounceCog(ReplyingCog):
    """The server's and each member's pronunciation dictionaries."""

    pronounce = app_commands.Group(name="pronounce", description="Fix how words are read", guild_only=True)

    def __init__(self, bot: VoiceBot) -> None:
        super().__init__(bot)
        self.dictionaries = Pronunciations(self.store)

    def _scope(self, interaction: discord.Interaction, mine: bool) -> tuple[str, int, str]:
        """(scope, owner id, how replies name it); the server's needs Manage Server."""
        guild, member = guild_member(interaction)
        if mine:
            return "user", member.id, "your dictionary"
        if not is_admin(interaction):
            raise UsageError("Changing this server's pronunciations needs Manage Server; add mine:True to fix a "
                             "word for your own messages.")
        return "guild", guild.id, "this server's dictionary"

    @pronounce.command(name="add", description="Fix how a word is read: a respelling or phones")
    @app_commands.describe(
        word="The word or phrase as people write it, e.g. Nguyen",
        say="Read it like this instead, e.g. win",
        phones="Or exact phones, e.g. W IH1 N (English) or chang2 (Chinese)",
        lang="The language of the phones (found by itself for English and Chinese)",
        mine="Only for your own messages (no Manage Server needed)",
    )
    @app_commands.choices(lang=LANG_CHOICES)
    async def add(self, interaction: discord.Interaction, word: str, say: str | None = None,
                  phones: str | None = None, lang: str | None = None, mine: bool = False) -> None:
        guild, member = guild_member(interaction)
        scope, owner, where = self._scope(interaction, mine)
        entry, replaced = await self.dictionaries.add(scope, owner, word, say=say, phones=phones, lang=lang)
        await interaction.response.defer(ephemeral=True, thinking=True)  # G2P may load its models first
        lexicon = await self.dictionaries.for_member(guild.id, member.id)
        report = await explain_phonemes(entry.word, "auto", lexicon)  # the entry matches in any language mode
        phones_read = " ".join(p for s in report["sentences"] for p in s["phones"])
        verb = "Updated" if replaced else "Added"
        text = f"{verb} in {where}: {entry.describe()}. It will be read as: `{phones_read}`"
        speech = self.services.speech
        if speech is not None and self._in_members_channel(guild, member):
            await speech.say(guild, member, entry.word, source="slash")
            text += "\nPlaying it in the voice channel."
        await send_ephemeral(interaction, text[:MAX_REPLY_CHARS])

    def _in_members_channel(self, guild: discord.Guild, member: discord.Member) -> bool:
        """Is the bot connected in the voice channel the member is in (where a preview may be spoken)?"""
        speech = self.services.speech
        channel = member.voice.channel if member.voice is not None else None
        if speech is None or channel is None:
            return False
        speaker = speech.speaker(guild.id)
        return bool(speaker.is_connected and speaker.channel is not None and speaker.channel.id == channel.id)

    async def _word_autocomplete(self, interaction: discord.Interaction, current: str):
        if interaction.guild_id is None:
            return []
        mine = bool(getattr(interaction.namespace, "mine", False))
        owner = interaction.user.id if mine else interaction.guild_id
        needle = current.strip().casefold()
        lexicon = await self.dictionaries.lexicon("user" if mine else "guild", owner)
        return [app_commands.Choice(name=e.describe()[:100], value=e.word[:100])
                for e in reversed(lexicon.entries) if needle in e.key][:MAX_CHOICES]

    @pronounce.command(name="remove", description="Remove a word's fix")
    @app_commands.describe(word="The word or phrase", mine="From your own dictionary")
    @app_commands.autocomplete(word=_word_autocomplete)
    async def remove(self, interaction: discord.Interaction, word: str, mine: bool = False) -> None:
        scope, owner, where = self._scope(interaction, mine)
        if not await self.dictionaries.remove(scope, owner, word):
            raise UsageError(f"“{' '.join(word.split())[:64]}” is not in {where}; see /pronounce list"
                             f"{' mine:True' if mine else ''}.")
        await send_ephemeral(interaction, f"Removed “{' '.join(word.split())}” from {where}.")

    @pronounce.command(name="list", description="The server's fixed words, or yours")
    @app_commands.describe(mine="Your own dictionary instead of the server's")
    async def list_entries(self, interaction: discord.Interaction, mine: bool = False) -> None:
        guild, member = guild_member(interaction)
        scope, owner = ("user", member.id) if mine else ("guild", guild.id)
        lexicon = await self.dictionaries.lexicon(scope, owner)
        if not lexicon:
            who = "You have" if mine else "This server has"
            await send_ephemeral(interaction, f"{who} no pronunciation fixes yet; add one with /pronounce add"
                                              f"{' mine:True' if mine else ''}.")
            return
        lines = [f"{i}. {e.describe()}" for i, e in enumerate(lexicon.entries, 1)]
        head = f"**{len(lines)} fix(es)**"
        body, shown = "", 0
        for line in lines:  # whole lines only, within Discord's limit; the rest is in the export
            if len(head) + len(body) + len(line) + 80 > MAX_REPLY_CHARS:
                break
            body += "\n" + line
            shown += 1
        more = f"\n… and {len(lines) - shown} more: /pronounce export" if shown < len(lines) else ""
        await send_ephemeral(interaction, head + body + more)

    @pronounce.command(name="check", description="See how a text will be read: normalised text and phones")
    @app_commands.describe(text="Any text", lang="The language (default: found by script)")
    @app_commands.choices(lang=[app_commands.Choice(name=c, value=c) for c in ("auto", "en", "zh", "ja", "ko", "yue")])
    async def check(self, interaction: discord.Interaction, text: str, lang: str = "auto") -> None:
        guild, member = guild_member(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)
        lexicon = await self.dictionaries.for_member(guild.id, member.id)
        report = format_explanation(await explain_phonemes(text, lang, lexicon))
        await send_ephemeral(interaction, f"```\n{report[:MAX_REPLY_CHARS - 8]}\n```")

    @pronounce.command(name="export", description="Download the server's dictionary, or yours, as a file")
    @app_commands.describe(mine="Your own dictionary instead of the server's")
    async def export(self, interaction: discord.Interaction, mine: bool = False) -> None:
        guild, member = guild_member(interaction)
        scope, owner = ("user", member.id) if mine else ("guild", guild.id)
        data = await self.dictionaries.export(scope, owner)
        name = "my-pronunciations.json" if mine else "server-pronunciations.json"
        await send_ephemeral(interaction, "Edit it and bring it back with /pronounce import.",
                             file=discord.File(io.BytesIO(data), filename=name))

    @pronounce.command(name="import", description="Load a dictionary file (all entries are checked first)")
    @app_commands.describe(file="A .json file as /pronounce export writes it",
                           replace="Replace the whole dictionary (default: add to it)",
                           mine="Into your own dictionary instead of the server's")
    async def import_file(self, interaction: discord.Interaction, file: discord.Attachment, replace: bool = False,
                          mine: bool = False) -> None:
        scope, owner, where = self._scope(interaction, mine)
        if file.size > MAX_IMPORT_BYTES:
            raise UsageError(f"{file.filename} is {file.size:,} bytes; a dictionary file is at most "
                             f"{MAX_IMPORT_BYTES:,}: split it.")
        await interaction.response.defer(ephemeral=True, thinking=True)
        imported, total = await self.dictionaries.import_file(scope, owner, await file.read(), replace=replace)
        await send_ephemeral(interaction, f"Imported {imported} entr{'y' if imported == 1 else 'ies'} into {where}"
                                          f"{' (replacing it)' if replace else ''}; it now holds {total}.")


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(PronounceCog(bot))
