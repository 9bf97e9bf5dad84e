"""Is the bot token shaped like a Discord bot token? Standard library only: ``make run`` calls this with the
system Python (``python3 -m bot.token_shape --config config.yaml``) before anything is installed or loaded.

A bot token is three base64url parts joined by dots: the bot's user id, a timestamp and a signature. What people
paste instead (the application id, the client secret, the public key, the token with ``Bot `` or quotes) has another
shape, and each gets a one-line answer that names what it looks like and where the right value is.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import re
import sys
from pathlib import Path

__all__ = ("token_shape_error", "token_env_from_config")

DEFAULT_TOKEN_ENV = "DISCORD_TOKEN"
_WHERE = "Discord developer portal -> your application -> Bot -> Reset Token"
_PART_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_SNOWFLAKE_RE = re.compile(r"^\d{15,21}$")


def _b64_digits(part: str) -> bool:
    """Whether a base64url part decodes to a user id (the token's first part)."""
    try:
        decoded = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        return False
    return bool(_SNOWFLAKE_RE.match(decoded))


def token_shape_error(token: str, env_name: str = DEFAULT_TOKEN_ENV) -> str | None:
    """One line saying what is wrong with the token's shape and where to get the right value; None when it fits.

    Parameters
    ----------
    token : str
        The value of the token's environment variable (stripped by the caller or not).
    env_name : str
        The variable's name, for the message.
    """
    t = token.strip()
    fix = f"put the bot token in {env_name} ({_WHERE})"
    if t[:1] in "\"'" and t[-1:] == t[:1] and len(t) > 1:
        return f"{env_name} is wrapped in quotes: put only the token in {env_name}, without the quotes"
    if t.lower().startswith("bot "):
        return f"{env_name} starts with 'Bot ': put only the token in {env_name}, without 'Bot '"
    if _SNOWFLAKE_RE.match(t):
        return f"{env_name} holds an application or user id, not a token: {fix}"
    if re.fullmatch(r"[0-9a-fA-F]{64}", t):
        return f"{env_name} holds the application's public key, not the bot token: {fix}"
    if re.fullmatch(r"[A-Za-z0-9_-]{32}", t):
        return f"{env_name} looks like the OAuth2 client secret, not the bot token: {fix}"
    parts = t.split(".")
    if len(parts) != 3 or not all(_PART_RE.match(p) for p in parts):
        return f"{env_name} is not shaped like a bot token (three parts joined by dots): {fix}"
    if not _b64_digits(parts[0]) or len(parts[1]) < 6 or len(parts[2]) < 27:
        return f"{env_name} is not shaped like a bot token (its parts are cut short or mistyped): {fix}"
    return None


def token_env_from_config(path: Path) -> str:
    """``discord.token_env`` read from the config file with a line scan (no YAML parser before the install);
    the default when the file or the key is missing."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return DEFAULT_TOKEN_ENV
    in_discord = False
    for line in lines:
        if re.match(r"^\S", line):  # a top-level key opens or closes the section
            in_discord = line.split("#", 1)[0].strip() == "discord:"
            continue
        match = re.match(r"^\s+token_env:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?\s*(#.*)?$", line)
        if in_discord and match:
            return match.group(1)
    return DEFAULT_TOKEN_ENV


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the token is set and shaped like a bot token; else one line on stderr and exit 2."""
    p = argparse.ArgumentParser(prog="python3 -m bot.token_shape",
                                description="Check that the bot token is shaped like a Discord bot token.")
    p.add_argument("--config", type=Path, default=Path("config.yaml"))
    args = p.parse_args(argv)
    env_name = token_env_from_config(args.config)
    token = os.environ.get(env_name, "").strip()
    if not token:
        print(f"set the {env_name} environment variable to your bot token ({_WHERE})", file=sys.stderr)
        return 2
    error = token_shape_error(token, env_name)
    if error is not None:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
