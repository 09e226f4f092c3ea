"""The agents this gateway knows: their roster (``agents.list``), identity (``agent.identity.get``) and heartbeats.

There is no agent configuration file here: every valid agent id is usable (``sessions.create`` places a session
under any of them) and all agents share the gateway's model provider. The roster is therefore the default agent
``main``, the agents a setting names (``OPENCLAW_AGENT_MAX_STEPS_BY_AGENT``) and every agent that owns a stored
session, as OpenClaw's roster is its configured agents plus those with state on disk.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from . import keys
from .models import Session

# OpenClaw's identity of an agent nobody named: the name and avatar its clients show.
DEFAULT_IDENTITY_NAME = "Assistant"
DEFAULT_IDENTITY_AVATAR = "A"


def model_ref() -> str:
    """The model every agent runs, as OpenClaw writes a model reference: ``<provider>/<model>``."""
    model = settings.OPENCLAW_MODEL
    return f"{model['PROVIDER']}/{model['MODEL']}"


def ordered_agent_ids(stored: Iterable[str]) -> list[str]:
    """``main`` first, then the agents of the settings and of ``stored`` (agent ids owning sessions), sorted."""
    others = {agent_id.strip().lower() for agent_id in settings.OPENCLAW_AGENT["MAX_STEPS_BY_AGENT"]}
    others.update(stored)
    others.discard(keys.DEFAULT_AGENT_ID)
    return [keys.DEFAULT_AGENT_ID, *sorted(others)]


def agent_ids() -> list[str]:
    # One scan of the agent column (distinct); the roster is read once per client start, not per call.
    stored = Session.objects.order_by().values_list("agent_id", flat=True).distinct()
    return ordered_agent_ids(stored)


def agents_list_payload() -> dict:
    return {
        "defaultId": keys.DEFAULT_AGENT_ID,
        # One default agent that needs no choosing, as OpenClaw says of a roster with a sole default.
        "ownership": "sole",
        "selectionRequired": False,
        "mainKey": keys.MAIN_KEY,
        "scope": "per-sender",
        "agents": [{"id": agent_id, "model": {"primary": model_ref()}} for agent_id in agent_ids()],
    }


def agent_identity_payload(agent_id: str) -> dict:
    """No agent has a configured name or avatar here: OpenClaw's defaults, said to be defaults."""
    return {
        "agentId": agent_id,
        "name": DEFAULT_IDENTITY_NAME,
        "nameSource": "default",
        "avatar": DEFAULT_IDENTITY_AVATAR,
    }


def heartbeat_summary(agent_ids: list[str]) -> dict:
    """OpenClaw's ``status.heartbeat``: agent heartbeats (periodic wake-up turns) do not exist here, so every agent
    is listed with the shape OpenClaw gives a disabled one."""
    return {
        "defaultAgentId": keys.DEFAULT_AGENT_ID,
        "agents": [
            {"agentId": agent_id, "enabled": False, "every": "disabled", "everyMs": None, "waitingForRoute": False}
            for agent_id in agent_ids
        ],
    }
