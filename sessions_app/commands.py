"""The slash commands the gateway itself handles when they are typed into ``chat.send`` (not sent to the model),
as OpenClaw's ``commands.list`` and ``chat.metadata`` describe commands.

This is the one catalogue of them: what the clients are told exists is what ``chat.send`` runs. They are text
commands (typed in a chat); this gateway has no messaging channels with native command menus.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_catalog import configured_model
from .models import Session
from .schemas import CommandsListParams


@dataclass(frozen=True)
class CommandArg:
    name: str
    description: str
    type: str = "string"


@dataclass(frozen=True)
class GatewayCommand:
    name: str
    description: str
    # OpenClaw's catalogue groups: "status", "session", "options", …
    category: str
    accepts_args: bool
    args: tuple[CommandArg, ...] = ()

    @property
    def text_alias(self) -> str:
        return f"/{self.name}"


GATEWAY_COMMANDS: tuple[GatewayCommand, ...] = (
    GatewayCommand("help", "Show available commands.", "status", accepts_args=False),
    GatewayCommand("status", "Show current status.", "status", accepts_args=True),
    GatewayCommand("new", "Start a new session.", "session", accepts_args=True),
    GatewayCommand("reset", "Reset the current session.", "session", accepts_args=True),
    GatewayCommand(
        "model",
        "Show or set the model.",
        "options",
        accepts_args=True,
        args=(CommandArg("model", "Model id"),),
    ),
)
COMMAND_SCOPE = "text"


def command_entry(command: GatewayCommand, *, include_args: bool) -> dict:
    entry: dict = {
        "name": command.name,
        "textAliases": [command.text_alias],
        "description": command.description,
        "category": command.category,
        "source": "native",
        "scope": COMMAND_SCOPE,
        "acceptsArgs": command.accepts_args,
    }
    if include_args and command.args:
        entry["args"] = [{"name": arg.name, "description": arg.description, "type": arg.type} for arg in command.args]
    return entry


def command_entries(*, scope: str, include_args: bool) -> list[dict]:
    """As OpenClaw filters: "both" (the default) lists every command, "text" or "native" those of that surface."""
    if scope not in ("both", COMMAND_SCOPE):
        return []
    return [command_entry(command, include_args=include_args) for command in GATEWAY_COMMANDS]


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
