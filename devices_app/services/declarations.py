"""What a connected node host declares of itself: its agent-visible skills (``node.skills.update``), its
plugin/MCP tools (``node.pluginTools.update``) and its resource samples (the ``node.host.stats`` node event).

Each is kept on the node's paired device row, so that every gateway process shows it on ``node.list`` and the
console. A declaration replaces the previous one whole, normalised as OpenClaw's gateway normalises it; one
that would exceed the stored bounds (``devices_app.schemas``) is refused and nothing is written.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway.exceptions import InvalidRequest
from gateway.selectors import now_ms

from .. import events
from ..models import PairedDevice
from ..schemas import (
    NODE_PLUGIN_TOOL_DESCRIPTION_MAX_CHARS,
    NODE_PLUGIN_TOOLS_MAX,
    NODE_PLUGIN_TOOLS_MAX_BYTES,
    NODE_SKILLS_CONTENT_MAX_BYTES,
    NodeHostStatsPayload,
    NodePluginToolDescriptor,
    NodeSkillDescriptor,
)
from ..selectors import node_catalog_changed

# OpenClaw's reserved plugin id of a node's MCP bridge: its tools must call mcp.tools.call.v1 with a server/tool.
NODE_MCP_PLUGIN_ID = "node-mcp"
NODE_MCP_COMMAND = "mcp.tools.call.v1"
# The parameters schema of a tool that declares none (OpenClaw's defaultParameters).
DEFAULT_TOOL_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": True}


class NodeNotPaired(InvalidRequest):
    """The calling node's device holds no node pairing any more (removed while it was connected)."""

    def __init__(self) -> None:
        super().__init__("unknown nodeId")


def normalized_skills(skills: list[NodeSkillDescriptor]) -> list[dict]:
    """OpenClaw's normalisation: names and descriptions trimmed, a repeated name kept once, sorted by name.

    The schema has already bounded each field and the count; the total content is bounded here and, unlike
    OpenClaw (which drops the skills beyond it), refused whole.
    """
    kept: dict[str, dict] = {}
    total_bytes = 0
    for skill in skills:
        name, description = skill.name.strip(), skill.description.strip()
        if not description or name in kept:
            continue
        total_bytes += len(skill.content.encode())
        kept[name] = {"name": name, "description": description, "content": skill.content}
    if total_bytes > NODE_SKILLS_CONTENT_MAX_BYTES:
        raise InvalidRequest(
            f"invalid node.skills.update params: skills content totals {total_bytes} bytes, "
            f"more than the {NODE_SKILLS_CONTENT_MAX_BYTES} a node may declare"
        )
    return [kept[name] for name in sorted(kept)]


def normalized_plugin_tools(tools: list[NodePluginToolDescriptor], *, allowed_commands: list[str]) -> list[dict]:
    """OpenClaw's normalisation: only tools that name a command this connection may run (and, under the
    reserved ``node-mcp`` id, an MCP bridge call), descriptions cut to 1024 characters, default parameters,
    sorted by plugin, name and command, one per (plugin, name), at most 128."""
    allowed = set(allowed_commands)
    entries: list[dict] = []
    for tool in tools:
        plugin_id, name = tool.pluginId.strip(), tool.name.strip()
        description = tool.description.strip()[:NODE_PLUGIN_TOOL_DESCRIPTION_MAX_CHARS]
        command = (tool.command or "").strip()
        if not plugin_id or not description or not command or command not in allowed:
            continue
        mcp = tool.mcp
        if plugin_id == NODE_MCP_PLUGIN_ID and (command != NODE_MCP_COMMAND or mcp is None):
            continue
        entry: dict[str, Any] = {
            "pluginId": plugin_id,
            "name": name,
            "description": description,
            "parameters": tool.parameters if tool.parameters is not None else DEFAULT_TOOL_PARAMETERS,
            "command": command,
        }
        if mcp is not None and mcp.server.strip() and mcp.tool.strip():
            entry["mcp"] = {"server": mcp.server.strip(), "tool": mcp.tool.strip()}
        entries.append(entry)
    entries.sort(key=lambda e: (e["pluginId"], e["name"], e["command"]))
    unique: dict[tuple[str, str], dict] = {}
    for entry in entries:
        unique.setdefault((entry["pluginId"], entry["name"]), entry)
    kept = list(unique.values())[:NODE_PLUGIN_TOOLS_MAX]
    size = len(json.dumps(kept, separators=(",", ":")).encode())
    if size > NODE_PLUGIN_TOOLS_MAX_BYTES:
        raise InvalidRequest(
            f"invalid node.pluginTools.update params: the tool catalog takes {size} bytes, "
            f"more than the {NODE_PLUGIN_TOOLS_MAX_BYTES} a node may declare"
        )
    return kept


def _store(*, node_id: str, **fields: Any) -> None:
    with transaction.atomic():
        updated = PairedDevice.objects.filter(device_id=node_id, is_node=True).update(**fields)
        if not updated:
            raise NodeNotPaired()
        node_catalog_changed()


def node_skills_update(*, node_id: str, skills: list[NodeSkillDescriptor]) -> list[dict]:
    """Replace the node's declared skills; returns what is kept (OpenClaw's answer)."""
    kept = normalized_skills(skills)
    _store(node_id=node_id, node_skills=kept, node_skills_updated_at=timezone.now())
    return kept


def node_plugin_tools_update(
    *, node_id: str, tools: list[NodePluginToolDescriptor], allowed_commands: list[str]
) -> list[dict]:
    """Replace the node's declared plugin tools; returns what is kept (OpenClaw's answer)."""
    kept = normalized_plugin_tools(tools, allowed_commands=allowed_commands)
    _store(node_id=node_id, node_plugin_tools=kept, node_plugin_tools_updated_at=timezone.now())
    return kept


def node_host_stats_record(*, node_id: str, stats: NodeHostStatsPayload) -> dict | None:
    """Keep the node's latest resource sample with the gateway's receipt time; None when the node is not paired
    (any more)."""
    host_stats = {**stats.model_dump(exclude_none=True), "updatedAtMs": now_ms()}
    with transaction.atomic():
        try:
            _store(node_id=node_id, host_stats=host_stats)
        except NodeNotPaired:
            return None
        events.publish_on_commit(
            events.EVENT_NODE_HOST_STATS, {"nodeId": node_id, "hostStats": host_stats}, drop_if_slow=True
        )
    return host_stats
