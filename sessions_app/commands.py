"""Commands typed into ``chat.send`` that the gateway answers itself instead of sending them to the model.

OpenClaw's gateway runs a message that is one of its text commands (``/status``, ``/new``, ...) as that command;
this module is the one table of the ones this gateway serves (docs/sessions-and-turns.md, "Commands in chat"):
:func:`gateway_commands` describes them (the shape of OpenClaw's ``commands.list`` entries),
:func:`parse_command` recognizes one in a message, and the reply texts are built here from facts the command
service reads (``services/commands.py`` does the work, in one transaction).

A message is a command when, leading and trailing blanks aside, it is ``/<name>`` (any case), optionally followed
by ``:`` and, for the commands that take them, arguments. Anything else, an unknown ``/foo`` included, is an ordinary
message for the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from gateway import scopes as sc

from .model_catalog import configured_model
from .models import Session
from .schemas import CommandsListParams
from .selectors import SessionStatus


@dataclass(frozen=True)
class CommandArg:
    name: str
    description: str
    type: str = "string"


@dataclass(frozen=True)
class GatewayCommand:
    name: str
    description: str
    # OpenClaw's groups of its command list and of /help: session, options, status.
    category: str
    # As /help shows it.
    usage: str
    # The operator scope the command's work needs (chat.send itself needs operator.write).
    scope: str
    accepts_args: bool
    args: tuple[CommandArg, ...] = ()

    def descriptor(self, *, include_args: bool = True) -> dict:
        """The command as OpenClaw's ``commands.list`` lists one of its own (text surface only here)."""
        described: dict = {
            "name": self.name,
            "textAliases": [f"/{self.name}"],
            "description": self.description,
            "category": self.category,
            "source": "native",
            "scope": COMMAND_SURFACE,
            "acceptsArgs": self.accepts_args,
        }
        if include_args and self.args:
            described["args"] = [{"name": a.name, "description": a.description, "type": a.type} for a in self.args]
        return described


# The surface of every command here: typed in a chat (no channel command menus).
COMMAND_SURFACE = "text"
FOLLOW_UP = CommandArg("message", "Sent to the model as the first message of the fresh transcript")

# In OpenClaw's order of its command list.
GATEWAY_COMMANDS: tuple[GatewayCommand, ...] = (
    GatewayCommand(
        name="help",
        description="Show available commands.",
        category="status",
        usage="/help",
        scope=sc.WRITE,
        accepts_args=False,
    ),
    GatewayCommand(
        name="status",
        description="Show current status.",
        category="status",
        usage="/status",
        scope=sc.WRITE,
        accepts_args=True,
    ),
    GatewayCommand(
        name="new",
        description="Start a new session.",
        category="session",
        usage="/new [message]",
        scope=sc.ADMIN,
        accepts_args=True,
        args=(FOLLOW_UP,),
    ),
    GatewayCommand(
        name="reset",
        description="Reset the current session.",
        category="session",
        usage="/reset [message]",
        scope=sc.ADMIN,
        accepts_args=True,
        args=(FOLLOW_UP,),
    ),
    GatewayCommand(
        name="model",
        description="Show or set this session's model.",
        category="options",
        usage="/model [provider/model|default]",
        scope=sc.WRITE,
        accepts_args=True,
        args=(CommandArg("model", "provider/model, a model id of the configured provider, or default"),),
    ),
)
BY_NAME = {command.name: command for command in GATEWAY_COMMANDS}


def gateway_commands() -> list[dict]:
    """Every command this gateway answers in chat, as ``commands.list`` entries."""
    return [command.descriptor() for command in GATEWAY_COMMANDS]


@dataclass(frozen=True)
class ParsedCommand:
    command: GatewayCommand
    # What follows the name (and its optional ":"), trimmed; "" for none.
    args: str


# "/name", then ":" or a blank or the end; the rest (which may span lines) is the arguments.
_COMMAND_RE = re.compile(r"/([A-Za-z]+)(?::|(?=\s)|$)\s*([\s\S]*)")


def parse_command(message: str) -> ParsedCommand | None:
    """The command ``message`` is, or None for a message meant for the model."""
    found = _COMMAND_RE.fullmatch(message.strip())
    if found is None:
        return None
    command = BY_NAME.get(found.group(1).lower())
    args = found.group(2).strip()
    if command is None or (args and not command.accepts_args):
        return None
    return ParsedCommand(command, args)


# --- reply texts ------------------------------------------------------------------------------------------------

NEW_DONE = "✅ New session started."
RESET_DONE = "✅ Session reset."
RESET_REFUSED = (
    "⚠️ You are not authorized to reset this session: resets need operator.admin. "
    "Ask your administrator to reset it, or send your message without the command."
)
_CATEGORY_TITLES = (("session", "Session"), ("options", "Options"), ("status", "Status"))


def help_text() -> str:
    lines = ["ℹ️ Help (commands this gateway answers itself; they never reach the model)"]
    for category, title in _CATEGORY_TITLES:
        usages = [command.usage for command in GATEWAY_COMMANDS if command.category == category]
        lines += ["", title, "  " + "  |  ".join(usages)]
    lines += ["", "Any other message starting with / goes to the model as it is."]
    return "\n".join(lines)


def status_text(status: SessionStatus, *, now: datetime | None = None) -> str:
    model = f"{status.model_provider}/{status.model}"
    default = f"{status.model_provider}/{status.default_model}"
    lines = [
        f"🦞 OpenClaw gateway {status.gateway_version} · up {duration(status.gateway_uptime_ms // 1000)}",
        "",
        f"🧠 Model: {model}" + (" (configured default)" if model == default else f" (default: {default})"),
        f"🧮 Tokens: {status.input_tokens} in / {status.output_tokens} out",
        f"📚 Transcript: {status.messages} message{'s' if status.messages != 1 else ''}",
        "",
        f"🧵 Session: {status.session_key} · id {status.session_id}" + _updated(status.updated_at, now),
        f"⚙️ Execution: {_execution(status.placement)}",
        f"🪢 Turns: {_turns(status)}",
    ]
    return "\n".join(lines)


def _updated(updated_at: datetime | None, now: datetime | None) -> str:
    if updated_at is None:
        return ""
    seconds = int(((now or timezone.now()) - updated_at).total_seconds())
    return " · updated just now" if seconds < 60 else f" · updated {duration(seconds)} ago"


def _execution(placement: dict | None) -> str:
    if placement is None or placement.get("state") == "local":
        return "on this gateway (not placed on a worker)"
    where = f"placement {placement['state']}"
    if placement.get("environmentId"):
        where += f" · environment {placement['environmentId']}"
    return where


def _turns(status: SessionStatus) -> str:
    now = "a turn is running" if status.running else "idle"
    if status.queued:
        now += f", {status.queued} queued"
    if not status.running and status.last_turn:
        now += f" · last turn {status.last_turn}"
    return now


def duration(seconds: int) -> str:
    """``45s``, ``3m 5s``, ``2h 10m``, ``3d 4h``: the two largest units."""
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def model_text(*, provider: str, model: str, default_model: str) -> str:
    return "\n".join(
        [
            f"Current: {provider}/{model}",
            f"Default: {provider}/{default_model}",
            f"Switch this session: /model <provider/model> (provider here: {provider})",
            "Back to the default: /model default",
        ]
    )


def model_set_text(*, provider: str, model: str) -> str:
    return f"Model set to {provider}/{model} for this session only; configured default unchanged."


def model_default_text(*, provider: str, default_model: str) -> str:
    return f"Session model reset to configured default ({provider}/{default_model})."


def model_unknown_provider_text(*, asked: str, provider: str) -> str:
    return f'⚠️ Unknown provider "{asked}". This gateway\'s models come from provider "{provider}".'


MODEL_USAGE = "⚠️ Usage: /model [provider/model|default] (one model; -s for this session is the only scope here)"
MODEL_DEFAULTS_REFUSED = (
    "⚠️ Only this session's model can be changed in chat here: the configured default comes from the "
    "gateway's settings (OPENCLAW_MODEL)."
)


# --- commands.list and chat.metadata ----------------------------------------------------------------------------


def command_entries(*, scope: str, include_args: bool) -> list[dict]:
    """As OpenClaw filters: "both" (the default) lists every command, "text" or "native" those of that surface."""
    if scope not in ("both", COMMAND_SURFACE):
        return []
    return [command.descriptor(include_args=include_args) for command in GATEWAY_COMMANDS]


def commands_list_payload(params: CommandsListParams) -> dict:
    # OpenClaw includes argument descriptions unless asked not to.
    return {"commands": command_entries(scope=params.scope or "both", include_args=params.includeArgs is not False)}


def chat_metadata_payload(session: Session | None) -> dict:
    """What a chat composer needs: the models, the commands with their arguments, and (for a session) whether its
    model choice is locked to it. No swarms and no account choice exist here."""
    return {
        "models": [configured_model()],
        "commands": command_entries(scope="both", include_args=True),
        "swarmEnabled": False,
        "accountSelection": {"kind": "automatic", "label": "Automatic account selection"},
        "runtimeSelectionLocked": bool(session is not None and session.model_selection_locked),
    }
