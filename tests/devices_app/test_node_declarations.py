"""What a node host declares of itself, as OpenClaw's node host sends it: ``node.skills.update``,
``node.pluginTools.update`` and the ``node.host.stats`` node event; kept on the paired device, shown on
``node.list``; bad or oversize declarations refused with nothing written."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.utils import timezone

from devices_app import selectors
from devices_app.models import PairedDevice
from devices_app.schemas import NODE_PLUGIN_TOOLS_MAX, NODE_SKILLS_CONTENT_MAX_BYTES, NodePluginToolsUpdateParams
from devices_app.services import connections as device_connections
from devices_app.services.declarations import normalized_plugin_tools
from gateway import scopes as sc
from gateway import state
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.models import GatewayConnection
from gateway.protocol import RequestFrame
from gateway.services import connections
from tests.support.connections import connection_record, node_context, operator_context

pytestmark = pytest.mark.django_db(transaction=True)

NODE_ID = "d" * 64
COMMANDS = ["system.run", "mcp.tools.call.v1", "camera.snap"]
STATS = {
    "cpuCount": 8,
    "loadAverage": [0.5, 0.25, 0.125],
    "memoryTotalBytes": 16 * 2**30,
    "memoryFreeBytes": 4 * 2**30,
    "diskTotalBytes": 500 * 2**30,
    "diskAvailableBytes": 200 * 2**30,
}


@pytest.fixture
def node() -> PairedDevice:
    connections.process_register(boot_id=state.BOOT_ID)
    device = PairedDevice.objects.create(
        device_id=NODE_ID,
        public_key="pk-node",
        display_name="Build node",
        roles=[sc.ROLE_NODE],
        approved_commands=COMMANDS,
        approved_at=timezone.now(),
    )
    register_node_connection("inmemory!node")
    return device


def register_node_connection(channel_name: str) -> None:
    """A connection of the node host, as its connect registers it."""
    record = connection_record(
        boot_id=state.BOOT_ID,
        channel_name=channel_name,
        role=sc.ROLE_NODE,
        device_id=NODE_ID,
        node_id=NODE_ID,
        client_id="node-host",
        client_mode="node",
        commands=COMMANDS,
    )
    device_connections.connection_register(record=record)


def node_ctx(commands: list[str] = COMMANDS) -> RpcContext:
    return node_context(NODE_ID, conn_id="node-conn", commands=commands)


def wire(ctx: RpcContext, method: str, params: Any) -> dict:
    return asyncio.run(run_request(ctx, RequestFrame(type="req", id="r1", method=method, params=params)))


def refusal(response: dict) -> tuple[str, str]:
    assert response["ok"] is False, response
    return response["error"]["code"], response["error"]["message"]


def stored() -> dict:
    device = PairedDevice.objects.get(device_id=NODE_ID)
    return {"skills": device.node_skills, "tools": device.node_plugin_tools, "stats": device.host_stats}


def listed() -> dict:
    nodes = wire(operator_context([sc.READ]), "node.list", {})["payload"]["nodes"]
    return next(node for node in nodes if node["nodeId"] == NODE_ID)


def skill(name: str, content: str = "Run the tests.", description: str = "How to test") -> dict:
    return {"name": name, "description": description, "content": content}


def test_skills_are_kept_normalised_answered_and_listed_without_content(node):
    answer = wire(
        node_ctx(),
        "node.skills.update",
        {"skills": [skill("zeta"), skill("alpha", description="  Alpha  "), skill("zeta", content="second")]},
    )

    assert answer["ok"] is True
    expected = [
        {"name": "alpha", "description": "Alpha", "content": "Run the tests."},
        {"name": "zeta", "description": "How to test", "content": "Run the tests."},
    ]
    assert answer["payload"] == {"nodeId": NODE_ID, "skills": expected}
    assert stored()["skills"] == expected
    assert listed()["nodeSkills"] == [
        {"name": "alpha", "description": "Alpha"},
        {"name": "zeta", "description": "How to test"},
    ]
    # A declaration replaces the last one whole.
    assert wire(node_ctx(), "node.skills.update", {"skills": []})["payload"] == {"nodeId": NODE_ID, "skills": []}
    assert stored()["skills"] == [] and listed()["nodeSkills"] == []


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"skills": [skill("Bad-Name")]},
        {"skills": [skill("a--b")]},
        {"skills": [skill("ok", content="")]},
        {"skills": [skill("ok", description="x" * 1025)]},
        {"skills": [skill("ok", content="x" * 65537)]},
        {"skills": [skill(f"s{i}") for i in range(65)]},
        {"skills": [{**skill("ok"), "version": 1}]},
        {"skills": [skill("ok")], "extra": True},
        {"skills": "ok"},
    ],
)
def test_bad_skill_declarations_are_refused_and_change_nothing(node, params):
    refused_with_nothing_written("node.skills.update", {"skills": [skill("kept")]}, params)


def refused_with_nothing_written(method: str, kept: dict, params: Any) -> None:
    wire(node_ctx(), method, kept)
    before = stored()

    code, message = refusal(wire(node_ctx(), method, params))

    assert code == "INVALID_REQUEST" and message.startswith(f"invalid {method} params")
    assert stored() == before


def test_skills_beyond_the_total_content_bound_are_refused_whole(node):
    chunk = "x" * 65536
    too_much = [skill(f"s{i}", content=chunk) for i in range(NODE_SKILLS_CONTENT_MAX_BYTES // 65536 + 1)]

    code, message = refusal(wire(node_ctx(), "node.skills.update", {"skills": too_much}))

    assert code == "INVALID_REQUEST"
    assert f"more than the {NODE_SKILLS_CONTENT_MAX_BYTES}" in message
    assert stored()["skills"] == []


def tool(name: str, command: str | None = "camera.snap", plugin: str = "camera", **extra: Any) -> dict:
    descriptor = {"pluginId": plugin, "name": name, "description": f"{name} tool", **extra}
    if command is not None:
        descriptor["command"] = command
    return descriptor


def test_plugin_tools_keep_only_what_the_connection_may_run_as_openclaw_answers(node):
    params = {
        "tools": [
            tool("snap"),
            tool("snap", command="system.run"),  # the same (plugin, name) again: the first by command wins
            tool("walk", command="robot.walk"),  # a command this connection may not run
            tool("nocommand", command=None),
            tool("fake", plugin="node-mcp", command="camera.snap"),  # the reserved id without the MCP bridge
            tool("search", plugin="node-mcp", command="mcp.tools.call.v1", mcp={"server": "web", "tool": "q"}),
            tool("typed", parameters={"type": "object", "properties": {"x": {"type": "string"}}}),
        ]
    }

    answer = wire(node_ctx(), "node.pluginTools.update", params)

    default = {"type": "object", "properties": {}, "additionalProperties": True}
    expected = [
        {
            "pluginId": "camera",
            "name": "snap",
            "description": "snap tool",
            "parameters": default,
            "command": "camera.snap",
        },
        {
            "pluginId": "camera",
            "name": "typed",
            "description": "typed tool",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            "command": "camera.snap",
        },
        {
            "pluginId": "node-mcp",
            "name": "search",
            "description": "search tool",
            "parameters": default,
            "command": "mcp.tools.call.v1",
            "mcp": {"server": "web", "tool": "q"},
        },
    ]
    assert answer["payload"] == {"nodeId": NODE_ID, "tools": expected}
    assert stored()["tools"] == expected
    assert listed()["nodePluginTools"] == expected


def test_at_most_128_plugin_tools_are_kept():
    params = NodePluginToolsUpdateParams.model_validate({"tools": [tool(f"t{i:03}") for i in range(200)]})
    kept = normalized_plugin_tools(params.tools, allowed_commands=COMMANDS)
    assert len(kept) == NODE_PLUGIN_TOOLS_MAX and kept[0]["name"] == "t000"


@pytest.mark.parametrize(
    "params",
    [
        {"tools": [tool("1bad")]},
        {"tools": [tool("ok", description="")]},
        {"tools": [{**tool("ok"), "unknown": 1}]},
        {"tools": [tool("ok", mcp={"server": "web"})]},
        {"tools": [tool("ok", parameters=[1])]},
        {"tools": None},
    ],
)
def test_bad_plugin_tool_declarations_are_refused_and_change_nothing(node, params):
    refused_with_nothing_written("node.pluginTools.update", {"tools": [tool("kept")]}, params)


def test_an_oversize_tool_catalog_is_refused_whole(node):
    schema = {"type": "object", "description": "y" * 4000}
    params = {"tools": [tool(f"t{i:03}", parameters=schema) for i in range(NODE_PLUGIN_TOOLS_MAX)]}

    code, message = refusal(wire(node_ctx(), "node.pluginTools.update", params))

    assert code == "INVALID_REQUEST" and "more than the" in message
    assert stored()["tools"] == []


def test_declarations_are_node_only_and_need_a_paired_node(node):
    for method, params in (("node.skills.update", {"skills": []}), ("node.pluginTools.update", {"tools": []})):
        assert refusal(wire(operator_context([sc.ADMIN]), method, params))[0] == "INVALID_REQUEST"
    PairedDevice.objects.filter(device_id=NODE_ID).update(roles=["operator"], is_node=False)
    assert refusal(wire(node_ctx(), "node.skills.update", {"skills": []})) == ("INVALID_REQUEST", "unknown nodeId")


def test_a_new_connection_starts_without_the_last_ones_declarations(node):
    wire(node_ctx(), "node.skills.update", {"skills": [skill("kept")]})
    wire(node_ctx(), "node.pluginTools.update", {"tools": [tool("snap")]})

    register_node_connection("inmemory!node2")

    assert stored()["skills"] == [] and stored()["tools"] == []


def host_stats_event(ctx: RpcContext, payload: Any, *, as_json: bool = True) -> dict:
    params = {"event": "node.host.stats"}
    params.update({"payloadJSON": json.dumps(payload)} if as_json else {"payload": payload})
    return wire(ctx, "node.event", params)


def test_host_stats_are_kept_with_their_receipt_time_listed_and_broadcast(node, monkeypatch):
    published: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        "devices_app.events.publish_on_commit", lambda event, payload, **kw: published.append((event, payload))
    )

    answer = host_stats_event(node_ctx(), STATS)

    assert answer["payload"] == {"ok": True, "event": "node.host.stats", "handled": True, "reason": "updated"}
    kept = stored()["stats"]
    assert {k: v for k, v in kept.items() if k != "updatedAtMs"} == STATS and kept["updatedAtMs"] > 0
    assert listed()["hostStats"] == kept
    assert published == [("node.hostStats", {"nodeId": NODE_ID, "hostStats": kept})]
    # Offline, the latest sample still shows (OpenClaw's lastHostStats).
    connections.connections_close(list(connections_of_node()), reason="test")
    selectors.node_catalog_changed()
    assert listed()["hostStats"] == kept and "nodeSkills" not in listed()


def connections_of_node():
    return GatewayConnection.objects.filter(node_id=NODE_ID)


@pytest.mark.parametrize(
    "payload",
    [
        {**STATS, "memoryFreeBytes": STATS["memoryTotalBytes"] + 1},
        {**STATS, "diskAvailableBytes": STATS["diskTotalBytes"] + 1},
        {k: v for k, v in STATS.items() if k != "diskAvailableBytes"},
        {**STATS, "cpuCount": 0},
        {**STATS, "cpuCount": "8"},
        {**STATS, "loadAverage": [1, 2]},
        {**STATS, "loadAverage": [1, 2, 100001]},
        {**STATS, "extra": 1},
        {"cpuCount": 1},
        [1, 2, 3],
        None,
    ],
)
def test_bad_host_stats_are_refused_as_openclaw_refuses_them_with_nothing_kept(node, payload):
    host_stats_event(node_ctx(), STATS)
    before = stored()

    answer = host_stats_event(node_ctx(), payload)

    assert answer["payload"] == {"ok": True, "event": "node.host.stats", "handled": False, "reason": "invalid_payload"}
    assert stored() == before


def test_host_stats_of_a_node_no_longer_paired_are_not_kept(node):
    PairedDevice.objects.filter(device_id=NODE_ID).update(roles=["operator"], is_node=False)

    answer = host_stats_event(node_ctx(), STATS, as_json=False)

    assert answer["payload"]["handled"] is False and answer["payload"]["reason"] == "stale_connection"
    assert stored()["stats"] is None
