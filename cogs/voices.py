"""``/voice ...`` and ``/forget-me``: enrol, clone (with an explicit consent step), choose, preview, share, delete.

A voice belongs to the member who recorded it and agreed to the consent statement; server voices are voices a
Manage Server member added for the whole guild. Deleting a voice, or ``/forget-me``, removes every derived byte.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import logging
import random
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot import SpeechError, Voice, speakable_languages
from cogs.base import (
    ReplyingCog,
    describe_error,
    UsageError,
    find_voice,
    guild_member,
    is_admin,
    send_ephemeral,
    style_autocomplete,
    usable_voices,
    voice_autocomplete,
)

if TYPE_CHECKING:
    from bot import VoiceBot

log = logging.getLogger(__name__)

MB = 1024 * 1024  # bytes
CONSENT_LABEL = "This is my own voice, or I have the speaker's permission"
CONSENT_TIMEOUT_S = 180.0  # seconds the consent / confirm buttons wait for a click
ENROLL_TTL_S = 3600.0  # seconds an /voice enroll sentence stays the pending transcript
EDIT_INTERVAL_S = 1.0  # seconds between two progress edits of one message (Discord rate limits)
PREVIEW_MAX_S = 15.0  # seconds of audio at most in a preview file
MAX_NAME_CHARS = 32  # characters in a voice name
MAX_TRANSCRIPT_CHARS = 500  # characters in a clip's transcript
AUDIO_EXTENSIONS = frozenset(
    {"wav", "wave", "mp3", "ogg", "oga", "opus", "flac", "m4a", "aac", "webm", "mp4", "mov", "mkv", "wma", "aiff",
     "aif", "caf", "3gp", "amr"}
)

# Sentences to read for /voice enroll: varied sounds, 4-8 s at a relaxed pace.
ENROLL_SENTENCES: dict[str, tuple[str, ...]] = {
    "en": (
        "On quiet evenings I like to cook something simple, open the window, and listen to the rain.",
        "My favourite place is a small harbour town where the boats come back just before sunset.",
        "Could you check whether the blue folder is still on the kitchen table? I think I left it there.",
        "We packed three sandwiches, a warm jacket and a map, then started up the hill at nine.",
    ),
    "zh": (
        "今天天气很好，我们一起去公园散步，顺便买一点新鲜的水果。",
        "我每天早上七点起床，先喝一杯热茶，然后开始一天的工作。",
    ),
    "ja": (
        "今日はとても良い天気なので、友達と一緒に公園を散歩しました。",
        "毎朝七時に起きて、温かいお茶を飲んでから仕事を始めます。",
    ),
    "ko": ("오늘은 날씨가 좋아서 친구와 함께 공원을 산책했습니다.",),
    "yue": ("今日天氣好好，我哋一齊去公園行下，順便買啲生果。",),
}
PREVIEW_SENTENCES: dict[str, str] = {
    "en": "Hello! This is how I sound. Nice to meet you.",
    "zh": "你好！这就是我的声音，很高兴认识你。",
    "ja": "こんにちは！これが私の声です。よろしくお願いします。",
    "ko": "안녕하세요! 제 목소리는 이렇습니다.",
    "yue": "你好！呢個就係我把聲。",
}
LANGUAGE_CHOICES = [  # only what this build can read: Discord offers nothing that would fail after consent
    app_commands.Choice(name=label, value=value)
    for value, label in (
        ("auto", "detect automatically"),
        ("en", "English"),
        ("zh", "Chinese (Mandarin)"),
        ("ja", "Japanese"),
        ("ko", "Korean"),
        ("yue", "Cantonese"),
    )
    if value in speakable_languages()
]
_STAGES = {
    "decoding": "Preparing your clip…",
    "encoding": "Encoding your voice…",
    "storing": "Saving your voice…",
    "done": "Voice saved.",
}


def consent_statement(server: bool) -> str:
    """The exact words the member agrees to (stored with the voice)."""
    whose = "a voice for this whole server" if server else "my voice"
    return (
        f"I confirm this recording is my own voice, or that I have the speaker's permission to clone it as {whose}. "
        "I understand the bot will speak with it, and that I can delete it at any time with /voice delete."
    )


class ConfirmView(discord.ui.View):
    """Two buttons only the invoking member may press; ``agreed`` is True, False (cancel) or None (timed out)."""

    def __init__(self, user_id: int, confirm_label: str, *, danger: bool = False, timeout: float = CONSENT_TIMEOUT_S):
        super().__init__(timeout=timeout)
        self.user_id = user_id
        self.agreed: bool | None = None
        self.click: discord.Interaction | None = None
        self.confirm.label = confirm_label
        self.confirm.style = discord.ButtonStyle.danger if danger else discord.ButtonStyle.success

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if interaction.user.id != self.user_id:
            await interaction.response.send_message("Only the member who ran the command can answer this.", ephemeral=True)
            return False
        return True

    @discord.ui.button(label="Confirm", style=discord.ButtonStyle.success)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.agreed, self.click = True, interaction
        self.stop()

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.agreed, self.click = False, interaction
        self.stop()

    async def settle(self, interaction: discord.Interaction, *, yes: str, no: str, timed_out: str) -> bool:
        """Wait for the click, replace the buttons with the matching line; True when confirmed."""
        await self.wait()
        text = yes if self.agreed else no if self.agreed is False else timed_out
        try:
            if self.click is not None:
                await self.click.response.edit_message(content=text, view=None)
            else:
                await interaction.edit_original_response(content=text, view=None)
        except discord.HTTPException:
            log.warning("could not update the confirmation message of /%s", interaction.command and interaction.command.name)
        return bool(self.agreed)


class ProgressMessage:
    """Keeps the command's original response up to date with a long job, at most one edit per ``EDIT_INTERVAL_S``.

    Lines are keyed (``"clone"``, ``"phrases"``) so later stages replace earlier text. :meth:`callback` makes a
    ``(stage, fraction)`` progress function that may be called from any thread.
    """

    def __init__(self, interaction: discord.Interaction) -> None:
        self._interaction = interaction
        self._loop = asyncio.get_running_loop()
        self._lines: dict[str, str] = {}
        self._dirty = False
        self._last_edit = 0.0
        self._task: asyncio.Task[None] | None = None
        self.edits = 0

    def set(self, key: str, text: str) -> None:
        """Replace one line (call on the event loop)."""
        if self._lines.get(key) == text:
            return
        self._lines[key] = text
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush())

    def callback(self, key: str, render: Callable[[str, float], str]) -> Callable[[str, float], None]:
        """A thread-safe progress callback that renders ``(stage, fraction)`` into line ``key``."""

        def report(stage: str, fraction: float) -> None:
            self._loop.call_soon_threadsafe(self.set, key, render(stage, fraction))

        return report

    async def _flush(self) -> None:
        """Edit until no change is pending, spacing edits out."""
        while self._dirty:
            wait = self._last_edit + EDIT_INTERVAL_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty = False
            try:
                await self._interaction.edit_original_response(content="\n".join(self._lines.values()))
            except discord.HTTPException as e:  # the interaction token lasts 15 minutes
                log.info("stopped updating a progress message: %s", e)
                return
            self.edits += 1
            self._last_edit = time.monotonic()

    async def drain(self) -> None:
        """Wait until the latest text has been shown."""
        while self._task is not None and not self._task.done():
            await self._task

    @property
    def text(self) -> str:
        return "\n".join(self._lines.values())


class VoiceCog(ReplyingCog):
    """Voice enrolment, cloning, selection, sharing and deletion."""

    voice = app_commands.Group(name="voice", description="Your cloned voices", guild_only=True)
    style = app_commands.Group(name="style", description="Named styles of your voices (calm, excited, ...)",
                               parent=voice)

    def __init__(self, bot: VoiceBot) -> None:
        super().__init__(bot)
        self._pending: dict[int, tuple[str, str, float]] = {}  # user id -> (sentence, language, monotonic time)
        self._background: set[asyncio.Task] = set()

    # ---- enrol / clone -------------------------------------------------------------------------------------------

    @voice.command(name="enroll", description="Get a sentence to read aloud for your voice recording")
    @app_commands.describe(language="Language of the sentence")
    @app_commands.choices(language=[c for c in LANGUAGE_CHOICES if c.value != "auto"])
    async def enroll(self, interaction: discord.Interaction, language: str = "en") -> None:
        """Give the member a sentence to record; it becomes the transcript of their next ``/voice clone``."""
        sentence = random.choice(ENROLL_SENTENCES[language])
        self._pending[interaction.user.id] = (sentence, language, time.monotonic())
        await interaction.response.send_message(
            "Record yourself reading this sentence in a quiet room, naturally, 3 to 10 seconds:\n"
            f"> {sentence}\n"
            "Then upload the recording with `/voice clone` (within an hour; I will use this sentence as its "
            "transcript).",
            ephemeral=True,
        )

    def _pending_sentence(self, user_id: int) -> tuple[str, str] | None:
        """The member's unexpired enrolment sentence and its language."""
        entry = self._pending.get(user_id)
        if entry is None or time.monotonic() - entry[2] > ENROLL_TTL_S:
            self._pending.pop(user_id, None)
            return None
        return entry[0], entry[1]

    @voice.command(name="clone", description="Clone a voice from a short recording (3-10 s of speech)")
    @app_commands.describe(
        clip="A recording of the voice: 3-10 s of clear speech (wav, mp3, ogg, m4a, flac, webm)",
        transcript="What is said in the clip (better quality); /voice enroll gives you a sentence to read",
        language="Language spoken in the clip",
        name="A name for the voice (default: your name)",
        server="Add it as a voice for the whole server (needs Manage Server)",
    )
    @app_commands.choices(language=LANGUAGE_CHOICES)
    async def clone(
        self,
        interaction: discord.Interaction,
        clip: discord.Attachment,
        transcript: str | None = None,
        language: str = "auto",
        name: str | None = None,
        server: bool = False,
    ) -> None:
        """Check everything that can be checked without the file, ask for consent, then download and clone."""
        guild, member = guild_member(interaction)
        await self._check_may_clone(interaction, guild, member, server)
        limit_mb = self.services.config.discord.max_attachment_mb
        if clip.size > limit_mb * MB:
            raise UsageError(
                f"That file is {clip.size / MB:.1f} MB; the limit is {limit_mb:g} MB. Upload 3-10 s of speech "
                "(a short clip is well under 1 MB)."
            )
        _check_audio_type(clip)
        voice_name = _clean_name(name) if name else _name_from(member.display_name)
        if any(v.name.lower() == voice_name.lower() for v in await self.voices.list(member.id)):
            raise UsageError(
                f"You already have a voice called {voice_name!r}: pick another name with the name option, or "
                f"remove the old one with /voice delete."
            )
        if transcript is not None and len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise UsageError(f"The transcript is {len(transcript)} characters; keep it under {MAX_TRANSCRIPT_CHARS}.")
        pending = self._pending_sentence(member.id)
        if pending is not None and language == "auto":
            language = pending[1]

        statement = consent_statement(server)
        view = ConfirmView(member.id, CONSENT_LABEL)
        await interaction.response.send_message(
            f"Before I clone **{voice_name}** from `{clip.filename}`:\n> {statement}\n"
            "Nothing is downloaded until you agree.",
            view=view,
            ephemeral=True,
        )
        agreed = await view.settle(
            interaction,
            yes="Thank you, consent recorded. Preparing your clip…",
            no="Cancelled; nothing was downloaded.",
            timed_out="No answer, so nothing was downloaded. Run /voice clone again when you are ready.",
        )
        if not agreed:
            return
        consent = {
            "user_id": member.id,
            "guild_id": guild.id,
            "statement": statement,
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "interaction_id": interaction.id,
            "clip": clip.filename,
            "clip_bytes": clip.size,
            "server_voice": server,
        }
        progress = ProgressMessage(interaction)
        progress.set("clone", "Thank you, consent recorded. Downloading your clip…")
        try:
            await self._download_and_clone(interaction, clip, voice_name, member, guild, consent, progress,
                                           transcript=transcript, language=language, server=server, pending=pending)
        except Exception as e:  # the answer replaces the progress message rather than arriving beside it
            message, unexpected = describe_error(e)
            if unexpected:
                log.error("/voice clone failed", exc_info=e)
            progress.set("clone", message)
            await progress.drain()

    async def _download_and_clone(
        self,
        interaction: discord.Interaction,
        clip: discord.Attachment,
        voice_name: str,
        member: discord.Member,
        guild: discord.Guild,
        consent: dict,
        progress: ProgressMessage,
        *,
        transcript: str | None,
        language: str,
        server: bool,
        pending: tuple[str, str] | None,
    ) -> None:
        """After consent: download, then one call creates the voice (consent, rows, phrase precompute)."""
        limit_mb = self.services.config.discord.max_attachment_mb
        data = await clip.read()
        if len(data) > limit_mb * MB:  # the metadata said otherwise; never hand an oversized file on
            raise UsageError(f"That file is larger than {limit_mb:g} MB; upload a shorter clip.")
        phrases_line = lambda done, total: progress.set(  # noqa: E731
            "phrases", f"Precomputing common phrases {done}/{total}…")
        made = await self.voices.create(
            voice_name,
            data,
            clip.filename,
            owner_id=member.id,
            guild_id=guild.id,
            server=server,
            transcript=transcript,
            language=language,
            consent=consent,
            enrollment_prompt=pending[0] if pending else None,
            progress=progress.callback("clone", lambda stage, frac: _STAGES.get(stage, f"{stage.capitalize()}…")),
            phrase_progress=phrases_line,
        )
        self._pending.pop(member.id, None)
        voice = made.voice
        where = "a server voice here" if server else "your voice"
        # a transcript was given but not stored: the clip had more speech than the seconds kept (the first note)
        dropped = bool(transcript or pending) and not voice.prompt_text
        without = ", without its transcript (see the first note)" if dropped else ""
        lines = [f"**{voice.name}** is ready as {where}{without}. Hear it with `/voice preview {voice.name}`."]
        lines += [f"Note: {w}" for w in made.warnings]
        if dropped:
            lines.append(f"To give it a transcript: trim your recording to the seconds it uses, remove this voice with "
                         f"`/voice delete {voice.name}`, and run `/voice clone` again with the words said in them as "
                         "`transcript`.")
        progress.set("clone", "\n".join(lines))
        if made.phrases is not None:
            self._show_precompute(voice, made.phrases, made.phrase_count, progress)

    async def _check_may_clone(
        self, interaction: discord.Interaction, guild: discord.Guild, member: discord.Member, server: bool
    ) -> None:
        """The guild's cloning switch and role, and Manage Server for server voices (admins always may)."""
        if server and not is_admin(interaction):
            raise UsageError(
                "Only members with Manage Server can add server voices; leave the server option off to clone your "
                "own voice."
            )
        if is_admin(interaction):
            return
        settings = await self.store.guild_settings(guild.id)
        if not settings["cloning_enabled"]:
            raise UsageError(
                "Voice cloning is turned off in this server; a server admin can turn it on with "
                "`/set guild cloning_enabled true`."
            )
        role_id = settings["clone_role"]
        if role_id is not None and member.get_role(role_id) is None:
            role = guild.get_role(role_id)
            raise UsageError(
                f"Cloning here needs the {role.mention if role else 'configured'} role; ask a server admin for it."
            )

    def _show_precompute(self, voice: Voice, task: asyncio.Task, total: int, progress: ProgressMessage) -> None:
        """Keep the phrase precompute's line up to date, ``n/m`` then its end."""
        progress.set("phrases", f"Precomputing common phrases 0/{total}…")

        def done(t: asyncio.Task) -> None:
            self._background.discard(t)
            if t.cancelled():
                progress.set("phrases", "Precomputing common phrases was stopped.")
            elif t.exception() is not None:
                log.error("precompute for voice %s failed", voice.id, exc_info=t.exception())
                progress.set("phrases", "Precomputing common phrases failed (logged); speech still works.")
            else:
                progress.set("phrases", f"Common phrases ready ({total}/{total}).")

        self._background.add(task)
        task.add_done_callback(done)

    # ---- choose / preview / list ---------------------------------------------------------------------------------

    async def _voice_name_autocomplete(self, interaction: discord.Interaction, current: str):
        return await voice_autocomplete(self.services, interaction, current)

    async def _own_voice_autocomplete(self, interaction: discord.Interaction, current: str):
        return await voice_autocomplete(self.services, interaction, current, own=True)

    @voice.command(name="use", description="Speak with this voice from now on")
    @app_commands.describe(name="One of your voices, a server voice, or a voice shared here")
    @app_commands.autocomplete(name=_voice_name_autocomplete)
    async def use(self, interaction: discord.Interaction, name: str) -> None:
        guild, member = guild_member(interaction)
        choice = await find_voice(self.services, guild.id, member.id, name)
        if choice.kind == "yours":  # your own voice follows you to every server...
            await self.store.set_user_setting(member.id, "voice", choice.voice.id)
            await self.store.set_user_setting(member.id, "voice", None, guild_id=guild.id)
        else:  # ...a server or shared voice only exists here
            await self.store.set_user_setting(member.id, "voice", choice.voice.id, guild_id=guild.id)
        await send_ephemeral(interaction, f"You now speak as **{choice.voice.name}** ({choice.kind}).")

    @voice.command(name="preview", description="Hear a voice: in the voice channel, or as a short file")
    @app_commands.describe(name="The voice (default: the one you speak with)")
    @app_commands.autocomplete(name=_voice_name_autocomplete)
    async def preview(self, interaction: discord.Interaction, name: str | None = None) -> None:
        guild, member = guild_member(interaction)
        if name:
            voice = (await find_voice(self.services, guild.id, member.id, name)).voice
        else:
            voice = await self._current_voice(guild, member)
        await interaction.response.defer(ephemeral=True, thinking=True)
        lang = voice.language if voice.language in PREVIEW_SENTENCES else "en"
        sample = PREVIEW_SENTENCES[lang]
        speech = self.services.speech
        channel = member.voice.channel if member.voice is not None else None
        speaker = speech.speaker(guild.id) if speech is not None else None
        if speech is not None and speaker is not None and speaker.is_connected and channel is not None \
                and speaker.channel is not None and speaker.channel.id == channel.id:  # we share a voice channel: say it there
            await speech.say(guild, member, sample, source="slash", voice=voice)
            await send_ephemeral(interaction, f"Speaking a sample in **{voice.name}** in {channel.mention}.")
            return
        data = await self.voices.preview_wav(sample, voice, PREVIEW_MAX_S)
        await interaction.followup.send(
            f"**{voice.name}** says: {sample}",
            file=discord.File(io.BytesIO(data), filename=f"{_file_stem(voice.name)}.wav"),
            ephemeral=True,
        )

    async def _current_voice(self, guild: discord.Guild, member: discord.Member) -> Voice:
        """The voice the member speaks with here, as the speech service chooses it."""
        if self.services.speech is None:
            raise UsageError("Speech is not running in this process; name a voice.")
        return await self.services.speech.resolve_voice(guild, member)

    @voice.command(name="list", description="The voices you can use here")
    async def list_voices(self, interaction: discord.Interaction) -> None:
        guild, member = guild_member(interaction)
        choices = await usable_voices(self.services, guild.id, member.id)
        if not choices:
            await send_ephemeral(
                interaction, "No voices yet: record yours with /voice enroll and /voice clone."
            )
            return
        try:
            current = (await self._current_voice(guild, member)).id
        except SpeechError:
            current = None
        shared_here = set(await self.store.shared_voices(guild.id))
        lines = []
        for c in choices:
            notes = [c.kind]
            if c.kind == "yours" and c.voice.id in shared_here:
                notes.append("shared here")
            if c.kind == "yours" and not c.voice.prompt_text:
                notes.append("no transcript")
            if c.voice.styles:
                notes.append("styles: " + ", ".join(sorted(st.name for st in c.voice.styles.values())))
            mark = " ← you speak with this" if c.voice.id == current else ""
            lines.append(f"• **{c.voice.name}** ({', '.join(notes)}){mark}")
        await send_ephemeral(interaction, "\n".join(lines)[:2000])

    # ---- extra clips / styles ------------------------------------------------------------------------------------

    async def _own_clip(self, interaction: discord.Interaction, clip: discord.Attachment, what: str,
                        **agreed_to: object) -> tuple[bytes, dict] | None:
        """Check an attachment from its metadata, ask for consent, then download it: its bytes and the consent
        record to store with it (who, when, the words agreed to, the clip, and ``agreed_to``: the voice, the
        style), or None when the member did not agree (nothing downloaded)."""
        limit_mb = self.services.config.discord.max_attachment_mb
        if clip.size > limit_mb * MB:
            raise UsageError(f"That file is {clip.size / MB:.1f} MB; the limit is {limit_mb:g} MB. Upload 3-10 s of "
                             "speech.")
        _check_audio_type(clip)
        statement = consent_statement(False)
        view = ConfirmView(interaction.user.id, CONSENT_LABEL)
        await interaction.response.send_message(
            f"Before I add `{clip.filename}` {what}:\n> {statement}\nNothing is downloaded until you agree.",
            view=view, ephemeral=True)
        if not await view.settle(interaction, yes="Thank you, consent recorded. Preparing your clip…",
                                 no="Cancelled; nothing was downloaded.",
                                 timed_out="No answer, so nothing was downloaded."):
            return None
        consent = {
            "user_id": interaction.user.id,
            "guild_id": interaction.guild_id,
            "statement": statement,
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "interaction_id": interaction.id,
            "clip": clip.filename,
            "clip_bytes": clip.size,
            **agreed_to,
        }
        data = await clip.read()
        if len(data) > limit_mb * MB:  # the metadata said otherwise; never hand an oversized file on
            raise UsageError(f"That file is larger than {limit_mb:g} MB; upload a shorter clip.")
        return data, consent

    async def _finish(self, interaction: discord.Interaction, work: Callable[[], object]) -> None:
        """Run the voice change after consent; its answer (or its error, in one line) replaces the consent message."""
        try:
            text = await work()  # type: ignore[misc]
        except Exception as e:
            text, unexpected = describe_error(e)
            if unexpected:
                log.error("voice change failed", exc_info=e)
        await interaction.edit_original_response(content=str(text)[:2000], view=None)

    @voice.command(name="add-clip", description="Add another recording of one of your voices (its timbre is averaged)")
    @app_commands.describe(name="One of your voices", clip="Another 3-10 s of the same voice speaking")
    @app_commands.autocomplete(name=_own_voice_autocomplete)
    async def add_clip(self, interaction: discord.Interaction, name: str, clip: discord.Attachment) -> None:
        guild, member = guild_member(interaction)
        voice = (await find_voice(self.services, guild.id, member.id, name, own=True)).voice
        agreed = await self._own_clip(interaction, clip, f"to **{voice.name}**", voice_id=voice.id)
        if agreed is None:
            return
        data, consent = agreed

        async def work() -> str:
            now, warnings = await self.voices.add_clips(voice, [(data, clip.filename)], consent=consent,
                                                        guild_id=guild.id)
            clips = 1 if now.clip_ges is None else now.clip_ges.shape[0]
            return "\n".join([f"**{now.name}** now speaks with the timbre of its {clips} clips.",
                               *(f"Note: {w}" for w in warnings)])

        await self._finish(interaction, work)

    async def _style_autocomplete(self, interaction: discord.Interaction, current: str):
        return await style_autocomplete(self.services, interaction, current, own=True)

    @style.command(name="add", description="Record a named style of one of your voices (e.g. calm, excited)")
    @app_commands.describe(name="One of your voices", style="The style's name, e.g. calm",
                           clip="3-10 s of the voice speaking in that style",
                           transcript="What is said in the clip (better quality)", language="Language of the clip")
    @app_commands.choices(language=LANGUAGE_CHOICES)
    @app_commands.autocomplete(name=_own_voice_autocomplete)
    async def style_add(self, interaction: discord.Interaction, name: str, style: str, clip: discord.Attachment,
                        transcript: str = "", language: str = "auto") -> None:
        from bot import VoiceError, check_name

        guild, member = guild_member(interaction)
        voice = (await find_voice(self.services, guild.id, member.id, name, own=True)).voice
        try:
            check_name(style, "style name")
        except VoiceError as e:
            raise UsageError(str(e)) from None
        if len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise UsageError(f"The transcript is {len(transcript)} characters; keep it under {MAX_TRANSCRIPT_CHARS}.")
        agreed = await self._own_clip(interaction, clip, f"as style **{style}** of **{voice.name}**",
                                      voice_id=voice.id, style=style)
        if agreed is None:
            return
        data, consent = agreed

        async def work() -> str:
            now, warnings = await self.voices.add_style(voice, style, data, clip.filename, consent=consent,
                                                        transcript=transcript, language=language, guild_id=guild.id)
            stored = now.styles.get(style.casefold())
            # its speech was partly left out, so the transcript was not kept (the first note says which seconds)
            dropped = bool(transcript.strip()) and stored is not None and not stored.prompt_text
            head = f"**{now.name}** has the style **{style}**: use it with `/say style:{style}`."
            if dropped:
                head += f" The style **{style}** is reference-free: its transcript was not kept (see the first note)."
            return "\n".join([head, *(f"Note: {w}" for w in warnings)])

        await self._finish(interaction, work)

    @style.command(name="remove", description="Remove a named style of one of your voices")
    @app_commands.autocomplete(name=_own_voice_autocomplete, style=_style_autocomplete)
    async def style_remove(self, interaction: discord.Interaction, name: str, style: str) -> None:
        guild, member = guild_member(interaction)
        voice = (await find_voice(self.services, guild.id, member.id, name, own=True)).voice
        now = await self.voices.remove_style(voice, style, guild_id=guild.id)
        await send_ephemeral(interaction, f"**{now.name}** no longer has the style **{style}**.")

    # ---- share / delete ------------------------------------------------------------------------------------------

    @voice.command(name="share", description="Let this server's members use one of your voices")
    @app_commands.autocomplete(name=_own_voice_autocomplete)
    async def share(self, interaction: discord.Interaction, name: str) -> None:
        guild, member = guild_member(interaction)
        voice = (await find_voice(self.services, guild.id, member.id, name, own=True)).voice
        if await self.voices.share(voice, guild.id, member.id):
            await send_ephemeral(interaction, f"**{voice.name}** is now shared with this server; undo with /voice unshare.")
        else:
            await send_ephemeral(interaction, f"**{voice.name}** was already shared with this server.")

    @voice.command(name="unshare", description="Stop sharing one of your voices with this server")
    @app_commands.autocomplete(name=_own_voice_autocomplete)
    async def unshare(self, interaction: discord.Interaction, name: str) -> None:
        guild, member = guild_member(interaction)
        voice = (await find_voice(self.services, guild.id, member.id, name, own=True)).voice
        if await self.voices.share(voice, guild.id, member.id, shared=False):
            await send_ephemeral(interaction, f"**{voice.name}** is no longer shared with this server.")
        else:
            await send_ephemeral(interaction, f"**{voice.name}** was not shared with this server.")

    @voice.command(name="delete", description="Delete one of your voices (or remove a server voice, as an admin)")
    @app_commands.autocomplete(name=_voice_name_autocomplete)
    async def delete(self, interaction: discord.Interaction, name: str) -> None:
        guild, member = guild_member(interaction)
        choice = await find_voice(self.services, guild.id, member.id, name)
        voice = choice.voice
        if voice.owner_id != member.id:
            if choice.kind == "server" and is_admin(interaction):
                await self.store.remove_guild_voice(guild.id, voice.id)
                await send_ephemeral(
                    interaction, f"**{voice.name}** is no longer a server voice here (its owner keeps it)."
                )
                return
            raise UsageError(
                f"**{voice.name}** belongs to someone else; only its owner can delete it. "
                "Pick another voice with /voice use."
            )
        view = ConfirmView(member.id, "Delete it", danger=True)
        await interaction.response.send_message(
            f"Delete **{voice.name}** for good? Its recording, its encodings and every cached sentence in it are "
            "removed, in every server.",
            view=view,
            ephemeral=True,
        )
        if not await view.settle(
            interaction, yes=f"Deleting **{voice.name}**…", no="Kept; nothing was deleted.",
            timed_out="No answer, so nothing was deleted.",
        ):
            return
        await self.voices.delete(voice.id)
        await interaction.edit_original_response(content=f"**{voice.name}** is deleted, with everything derived from it.")

    @app_commands.command(name="forget-me", description="Delete all your voices, settings and records everywhere")
    async def forget_me(self, interaction: discord.Interaction) -> None:
        user_id = interaction.user.id
        voices = await self.voices.list(user_id)
        view = ConfirmView(user_id, "Forget me", danger=True)
        await interaction.response.send_message(
            f"This deletes your {len(voices)} voice(s), your settings, nicknames and consent records in every "
            "server, and cannot be undone.",
            view=view,
            ephemeral=True,
        )
        if not await view.settle(
            interaction, yes="Forgetting you…", no="Cancelled; nothing was deleted.",
            timed_out="No answer, so nothing was deleted.",
        ):
            return
        deleted, counts = await self.voices.forget_user(user_id)
        self._pending.pop(user_id, None)
        await interaction.edit_original_response(
            content=f"Done: {deleted} voice(s) and {sum(counts.values())} stored record(s) about you are deleted."
        )

    async def cog_unload(self) -> None:
        for task in list(self._background):
            task.cancel()


def _check_audio_type(clip: discord.Attachment) -> None:
    """Refuse files that are plainly not recordings, from the metadata alone."""
    ext = clip.filename.rsplit(".", 1)[-1].lower() if "." in clip.filename else ""
    ctype = (clip.content_type or "").split(";")[0].strip().lower()
    if ctype.startswith(("audio/", "video/")) or (not ctype and ext in AUDIO_EXTENSIONS) or (
        ctype == "application/octet-stream" and ext in AUDIO_EXTENSIONS
    ):
        return
    raise UsageError(
        f"`{clip.filename}` ({ctype or 'unknown type'}) is not a recording; upload an audio file "
        "(wav, mp3, ogg, m4a, flac or webm) with 3-10 s of speech."
    )


def _clean_name(name: str) -> str:
    """A voice name the voice store accepts (checked here, before consent and download), trimmed, single-spaced."""
    from bot import VoiceError, check_name

    name = " ".join(name.split())
    try:
        check_name(name)
    except VoiceError as e:
        raise UsageError(f"{e}; pick another name with the name option") from None
    return name


def _name_from(display_name: str) -> str:
    """A voice name made from a display name: the characters the store refuses become spaces."""
    name = " ".join(re.sub(r"[^\w -]+", " ", display_name).split())[:MAX_NAME_CHARS].strip()
    return _clean_name(name or "my voice")


def _file_stem(name: str) -> str:
    """A safe file name stem."""
    return re.sub(r"[^\w\-]+", "_", name).strip("_") or "voice"


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(VoiceCog(bot))
