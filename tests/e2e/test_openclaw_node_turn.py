"""A turn on OpenClaw's own node host, unmodified (node-worker-dialect.md §1.6–§1.8, option B of §3.5).

OpenClaw's node host (``../shared/tools/openclaw-cli``'s ``node run``, session hosting on) pairs and declares its
worker host; the session's placement is made active on it directly in the database, with the worker bundle put where
the node keeps installed bundles and a workspace folder on its side (installing the bundle and syncing the
workspace are other parts of the dialect, tested with them). Then three turns: the gateway launches each on the
node (``worker.launch.v1``, polled by ``worker.status.v1``), the node spawns the bundle's ``worker.mjs``, and the
worker fetches its launch and reports over the gateway's worker routes: a reply (the run's outcome and the
transcript's message); an exec question, decided by the gateway's exec policy and answered to the worker; and a
turn aborted while its worker holds, which reaches the node as ``worker.cancel.v1`` and the worker as its cancel
line. The worker here is a minimal one written for this test (the project's own worker is
``workers_app/openclaw_worker/``): what is under test is the gateway's side and OpenClaw's node between them.
Under the PostgreSQL + Redis profile the turns run in a Celery worker and the routes in the gateway process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.utils.timezone import now

from approvals_app.models import ExecApproval, ExecApprovalPolicy
from sessions_app.models import Run, Session, TranscriptEvent
from tests.e2e.test_openclaw_compat import start_openclaw_node, wait_until
from tests.e2e.test_openclaw_node_worker import approve_node, bundle_status
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import Wire, model_env, publish_workspace
from tests.support.clients import operator
from tests.support.openclaw_cli import require_openclaw_cli
from tests.support.processes import ROOT
from tests.workers_app.test_inference_proxy import ENVIRONMENT, placed_session
from workers_app.models import Placement, WorkerEnvironment
from workers_app.nodes.openclaw.bundle import BundleFile, bundle_files, manifest_hash
from workers_app.nodes.openclaw.dialect import node_speaks_openclaw

pytestmark = [pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]

# The gateway's gatewayNamespace: derived from its secret key, which is the gateway process's own.
NAMESPACE_OF_THE_GATEWAY = "from workers_app.nodes.openclaw.dialect import gateway_namespace as g; print(g())"
# The worker process protocol as OpenClaw's node supervisor drives it (docs/node-worker-protocol.md).
STUB_WORKER = r"""
import { createInterface } from "node:readline";
if (process.argv.includes("--internal-worker-prewarm")) process.exit(0);
const started = new Promise((resolve) => process.on("message", (message) => {
  if (message && message.type === "openclaw-worker-start-v1") resolve();
}));
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
await started;
const turn = JSON.parse((await lines.next()).value);
const descriptor = turn.descriptor;
const endpoint = new URL(descriptor.connectionEndpoint.url);
const origin = `${endpoint.protocol === "wss:" ? "https:" : "http:"}//${endpoint.host}`;
const base = `${origin}/api/workers/turns/${encodeURIComponent(descriptor.assignment.runId)}`;
const headers = { authorization: `Bearer ${descriptor.admission.credential}`, "content-type": "application/json" };
const post = async (route, body) => {
  const answer = await fetch(`${base}/${route}`, { method: "POST", headers, body: JSON.stringify(body) });
  if (!answer.ok) console.error(`${route} refused: ${answer.status} ${await answer.text()}`);
  return answer.json();
};
const launch = await (await fetch(`${base}/launch`, { headers })).json();
const prompt = launch.messages.at(-1).content;
let end;
if (prompt.includes("HOLD")) {
  // Holds until the node passes the gateway's cancel on (a line on stdin), then ends aborted.
  await post("progress", { items: [{ kind: "delta", text: "holding" }] });
  (await import("node:fs")).writeFileSync(`${descriptor.assignment.workspaceDir}/holding`, "");
  const cancel = JSON.parse((await lines.next()).value);
  end = { status: "aborted", text: cancel.type === "cancel" ? "holding" : "holding?" };
} else if (prompt.includes("ASK-EXEC")) {
  const question = { toolCallId: "call-1", command: "rm -rf /tmp/x", workdir: descriptor.assignment.workspaceDir,
    envKeys: [], timeoutS: 5 };
  const decision = await post("approval", question);
  end = { status: "ok", text: `allowed=${decision.allowed} reason=${decision.reason}`, stopReason: "stop" };
} else {
  end = { status: "ok", text: `STUB-WORKER saw: ${prompt}`, stopReason: "stop" };
}
const items = [{ kind: "delta", text: end.text.slice(0, 7) }, { kind: "end", result: end }];
await post("progress", { items });
const { baseLeafId, nextSeq } = descriptor.assignment.transcript;
const result = { status: "completed", transcriptLeafId: baseLeafId, transcriptNextSeq: nextSeq };
process.stdout.write(JSON.stringify({ type: "result", turnId: turn.turnId, result, retainWorker: false }) + "\n");
process.exit(0);
"""


@dataclass
class PlacedOnNode:
    node_id: str
    session: Session
    workspace: Path
    node_log: Path


@contextlib.contextmanager
def session_on_openclaws_node(gateway, files: list[BundleFile], home: Path):
    """OpenClaw's node host (its HOME ``home``, the ``node_home`` fixture) paired and hosting, ``files`` installed
    as this gateway's bundle on it (named by their manifest hash, as an install names it), and a session whose
    placement is active there (a workspace folder on the node's side); the node stops on exit."""
    require_openclaw_cli()
    node_log = home / "node-host.log"
    with node_log.open("w") as log:
        node = start_openclaw_node(gateway, str(home), stderr=log)
    try:
        node_id = approve_node()
        wait_until(lambda: node_speaks_openclaw(node_id), 60)

        namespace = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", NAMESPACE_OF_THE_GATEWAY],
            env=gateway.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.split()[-1]
        bundle_hash = manifest_hash(files)
        bundle = home / ".openclaw" / "node-host" / namespace / "bundles" / bundle_hash
        bundle.mkdir(parents=True)
        for file in files:
            (bundle / file.path).write_bytes(file.data)
        workspace = home / "workspace"
        workspace.mkdir()

        session = placed_session(node_id, key=f"agent:main:openclaw-node-{uuid.uuid4().hex[:8]}")
        WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(
            bootstrap_bundle_hash=bundle_hash,
            bootstrap_openclaw_version="2026.9.6-django+test",
            bootstrap_protocol_features=[],
            bootstrap_install_kind="bundle",
        )
        Placement.objects.filter(pk=session.pk).update(remote_workspace_dir=str(workspace))
        yield PlacedOnNode(node_id, session, workspace, node_log)
    finally:
        node.terminate()
        node.wait(20)


def test_a_turn_runs_on_openclaws_node_host_through_the_worker_routes(gateway, node_home):
    stub = [BundleFile("worker.mjs", 0o600, STUB_WORKER.encode())]
    with session_on_openclaws_node(gateway, stub, node_home) as placed:
        session, workspace = placed.session, placed.workspace
        ExecApprovalPolicy.objects.create(
            scope="gateway", document={"version": 1, "defaults": {"security": "deny"}}, hash="h", updated_at=now()
        )

        async def turns():
            admin = operator(gateway)
            await admin.connect()
            outcomes = []
            for message in ("Reply exactly: E2E-MARKER", "ASK-EXEC then reply"):
                sent = await admin.request(
                    "chat.send", {"sessionKey": session.key, "message": message, "idempotencyKey": str(uuid.uuid4())}
                )
                outcomes.append(await admin.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 90_000}))
            held = await admin.request(
                "chat.send", {"sessionKey": session.key, "message": "HOLD", "idempotencyKey": str(uuid.uuid4())}
            )
            for _attempt in range(600):  # until the worker holds (it said so in the workspace)
                if (workspace / "holding").exists():
                    break
                await asyncio.sleep(0.1)
            await admin.request("chat.abort", {"sessionKey": session.key, "runId": held["runId"]})
            outcomes.append(await admin.request("agent.wait", {"runId": held["runId"], "timeoutMs": 90_000}))
            history = await admin.request("chat.history", {"sessionKey": session.key})
            await admin.close()
            return outcomes, history, held["runId"]

        outcomes, history, held_run = asyncio.run(turns())
    node_log = placed.node_log.read_text()
    context = (gateway.log()[-4000:], node_log[-4000:])
    assert [outcome["status"] for outcome in outcomes[:2]] == ["ok", "ok"], (outcomes, context)
    replies = [m["content"][0]["text"] for m in history["messages"] if m["role"] == "assistant"]
    assert replies[0] == "STUB-WORKER saw: Reply exactly: E2E-MARKER"
    # The exec question went to the gateway's gate (the policy denies) and its answer back to the worker.
    assert replies[1] == "allowed=false reason=exec denied: security=deny: the exec policy denies every command"
    assert not ExecApproval.objects.exists()
    # The abort reached the node as worker.cancel.v1, the node passed it to the worker, the turn ended aborted.
    aborted = Run.objects.get(run_id=held_run)
    assert aborted.status == "aborted", (outcomes[2], aborted.error, context)
    assert replies[2] == "holding"


def one_turn(server, session_key: str, message: str) -> tuple[str, dict, dict]:
    """``chat.send`` of ``message``, the run's end (``agent.wait``) and the session's history after it."""

    async def turn():
        admin = operator(server)
        await admin.connect()
        sent = await admin.request(
            "chat.send", {"sessionKey": session_key, "message": message, "idempotencyKey": str(uuid.uuid4())}
        )
        waited = await admin.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 90_000}, timeout=95)
        history = await admin.request("chat.history", {"sessionKey": session_key})
        await admin.close()
        return sent["runId"], waited, history

    return asyncio.run(turn())


@contextlib.contextmanager
def openclaw_node_without_the_bundle(gateway, home: Path):
    """OpenClaw's node host (its HOME ``home``, logging to ``node-host.log`` there) paired, approved and hosting,
    this gateway's bundle not installed yet; its node id. The node stops on exit."""
    require_openclaw_cli()
    with (home / "node-host.log").open("w") as log:
        node = start_openclaw_node(gateway, str(home), stderr=log)
    try:
        node_id = approve_node()
        wait_until(lambda: bundle_status(node_id) == "missing", 90)
        yield node_id
    finally:
        node.terminate()
        node.wait(20)


def test_the_projects_worker_runs_a_turn_on_openclaws_node_host(gateway, node_home):
    """The bundle is the project's worker (``workers_app/openclaw_worker/*.mjs``, as provisioning packs it): it asks
    the gateway's model (the built-in echo model here) through the inference route and reports its reply."""
    with session_on_openclaws_node(gateway, bundle_files(), node_home) as placed:
        _run_id, waited, history = one_turn(gateway, placed.session.key, "Reply exactly: REAL-WORKER-MARKER")
    context = (gateway.log()[-4000:], placed.node_log.read_text()[-4000:])
    assert waited["status"] == "ok", (waited, context)
    replies = [m["content"][0]["text"] for m in history["messages"] if m["role"] == "assistant"]
    assert replies == ["REAL-WORKER-MARKER"], (replies, context)


def test_the_projects_worker_runs_the_agents_tools_in_the_nodes_workspace(model_gateway, node_home):
    """A model that calls tools (the mock's tool plan): the worker runs them in the node's workspace, and every
    call and result is in the gateway's transcript, keyed by its step, before the final answer."""
    plan = {
        "steps": [
            {"calls": [{"name": "write", "arguments": {"path": "notes/a.txt", "content": "written on the node"}}]},
            {"calls": [{"name": "read", "arguments": {"path": "notes/a.txt"}}]},
        ],
        "final": "read back: {last_tool_result}",
    }
    with session_on_openclaws_node(model_gateway, bundle_files(), node_home) as placed:
        run_id, waited, history = one_turn(model_gateway, placed.session.key, f"TOOL_PLAN: {json.dumps(plan)}")
    context = (model_gateway.log()[-4000:], placed.node_log.read_text()[-4000:])
    assert waited["status"] == "ok", (waited, context)
    assert (placed.workspace / "notes" / "a.txt").read_text() == "written on the node"
    keyed = dict(
        TranscriptEvent.objects.filter(window__session__key=placed.session.key, type="message")
        .exclude(idempotency_key=None)
        .values_list("idempotency_key", "body")
    )
    steps = {key.removeprefix(f"{run_id}:"): body for key, body in keyed.items() if key.startswith(f"{run_id}:s")}
    assert sorted(steps) == ["s1.a", "s1.r1", "s2.a", "s2.r1"], (sorted(keyed), context)
    assert [part["name"] for part in steps["s1.a"]["content"] if part["type"] == "toolCall"] == ["write"]
    assert steps["s2.r1"]["role"] == "toolResult" and steps["s2.r1"]["toolName"] == "read"
    assert "written on the node" in steps["s2.r1"]["content"][0]["text"]
    final = [m for m in history["messages"] if m["role"] == "assistant"][-1]
    assert (
        final["content"][0]["text"].startswith("read back: ") and "written on the node" in final["content"][0]["text"]
    )


def test_a_session_dispatched_onto_openclaws_node_host_runs_its_turn_there(model_gateway, node_home):
    """The whole way, over the wire: ``sessions.dispatch`` installs the bundle and syncs the workspace onto the
    node (provisioning and transfers), and the next turn runs there with the project's worker: its tool writes into
    the node's copy of the workspace."""
    plan = {"steps": [{"calls": [{"name": "write", "arguments": {"path": "proof.txt", "content": "ran here"}}]}]}
    with openclaw_node_without_the_bundle(model_gateway, node_home) as node_id:

        async def dispatch():
            admin = operator(model_gateway)
            await admin.connect()
            await admin.request("sessions.create", {"key": "turn-on-openclaw-node"})
            dispatched = await admin.request_frame(
                "sessions.dispatch", {"key": "turn-on-openclaw-node", "deviceId": node_id}, timeout=120
            )
            await admin.close()
            return dispatched

        dispatched = asyncio.run(dispatch())
        _run_id, waited, history = one_turn(
            model_gateway, "agent:main:turn-on-openclaw-node", f"TOOL_PLAN: {json.dumps({**plan, 'final': 'done'})}"
        )
    context = (model_gateway.log()[-4000:], (node_home / "node-host.log").read_text()[-4000:])
    assert dispatched["ok"] and dispatched["payload"]["placement"]["state"] == "active", (dispatched, context)
    assert waited["status"] == "ok", (waited, context)
    assistant = [m for m in history["messages"] if m["role"] == "assistant"]
    assert assistant[-1]["content"][0]["text"] == "done", (assistant, context)
    workspace = Path(Placement.objects.get(session__key="agent:main:turn-on-openclaw-node").remote_workspace_dir)
    assert workspace.is_relative_to(node_home) and (workspace / "proof.txt").read_text() == "ran here"


def test_a_session_reset_on_openclaws_node_host_keeps_its_workspace_and_moves_back(
    gateway_factory, mock_openai, node_home, tmp_path
):
    """``sessions.reset`` gives a placed session a new id; OpenClaw's node keeps the session's workspace under the id
    it was synced with. After the reset the next turn runs in the same node workspace (it reads a file the turn
    before the reset wrote), and the move back reconciles that workspace into the worktree and stops the worker."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    gateway = gateway_factory(extra_env=model_env(mock_openai, allowed))
    write_plan = {
        "steps": [{"calls": [{"name": "write", "arguments": {"path": "before-reset.txt", "content": "kept"}}]}],
        "final": "written",
    }
    read_plan = {
        "steps": [{"calls": [{"name": "read", "arguments": {"path": "before-reset.txt"}}]}],
        "final": "read back: {last_tool_result}",
    }
    with openclaw_node_without_the_bundle(gateway, node_home) as node_id:

        async def lifecycle():
            admin = operator(gateway)
            await admin.connect()
            wire = Wire(admin, publish_workspace(allowed))
            key = await wire.create_session("reset")
            await wire.dispatch_node_session(key, node_id)
            synced_id = (await admin.request("sessions.describe", {"key": key}))["session"]["sessionId"]
            before = await turn(admin, key, f"TOOL_PLAN: {json.dumps(write_plan)}")
            reset = await admin.request("sessions.reset", {"key": key})
            after = await turn(admin, key, f"TOOL_PLAN: {json.dumps(read_plan)}")
            history = await wire.history(key)
            moved = await wire.move_to_gateway(key)
            await admin.close()
            return key, synced_id, before, reset, after, history, moved

        key, synced_id, before, reset, after, history, moved = asyncio.run(lifecycle())
    context = (gateway.log()[-4000:], (node_home / "node-host.log").read_text()[-4000:])
    assert before["status"] == "ok" and after["status"] == "ok", (before, after, context)
    session = Session.objects.get(key=key)
    assert session.session_id != synced_id, (reset, context)  # a new transcript generation
    final = [m for m in history if m["role"] == "assistant"][-1]["content"][0]["text"]
    assert final.startswith("read back: ") and "kept" in final, (final, context)
    # The move back reconciled the node's workspace (written before the reset) into the worktree.
    assert moved["state"] == "local", (moved, context)
    assert (Path(session.worktree["path"]) / "before-reset.txt").read_text() == "kept"
    environment = WorkerEnvironment.objects.filter(node_device_id=node_id).order_by("-created_at_ms").first()
    assert environment is not None and environment.state == "destroyed", (environment and environment.state, context)


async def turn(admin, key: str, message: str) -> dict:
    """``chat.send`` of ``message`` and the run's end (``agent.wait``)."""
    sent = await admin.request(
        "chat.send", {"sessionKey": key, "message": message, "idempotencyKey": str(uuid.uuid4())}
    )
    return await admin.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 90_000}, timeout=95)
