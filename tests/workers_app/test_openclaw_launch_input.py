"""The launch of a turn on OpenClaw's node host, checked by OpenClaw's own code (node-worker-dialect.md §1.6).

``worker.launch.v1``'s params must pass the node's strict parser (``validateNodeWorkerLaunchInput``, which parses
the version-4 descriptor with ``parseWorkerLaunchPlan``), the receipts' ``planHash`` the gateway expects must be
the one the node computes (``nodeWorkerPlanHash``), and the result line the worker prints echoes the transcript
cursors of the launch, which OpenClaw's ``parseWorkerProcessResult`` must accept. Node 24 runs a small script that
imports those functions from the installed package's ``dist/`` chunks.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.openclaw_cli import node_binary, openclaw_dist
from workers_app.nodes.openclaw import turns
from workers_app.nodes.openclaw.turns import LaunchFacts, LaunchRefused, launch_identity, launch_input, rearmed
from workers_app.nodes.turn_tokens import inference_token

NODE_ID = "c3" * 32
BUILD = {
    "bundleHash": "d" * 64,
    "openclawVersion": "2026.9.6-django+1",
    "protocolFeatures": ["worker-execution-context-v2", "worker-execution-authority-v1"],
}
FACTS = LaunchFacts(
    environment_id="worker:device:abc",
    session_id="6f1c2d9e-1111-4222-8333-944455556666",
    owner_epoch=3,
    placement_generation=7,
    workspace_dir="/home/node/.openclaw/node-host/gateway-x/workspaces/aa/bb/3",
    build=BUILD,
)

# Imports OpenClaw's functions by name from the chunks that export them (the chunks' export letters are minified).
SCRIPT = r"""
const [protocolChunk, processChunk] = process.argv.slice(1);
function exported(source, name) {
  const match = new RegExp(`\\b${name} as (\\w+)\\b`).exec(source);
  if (!match) throw new Error(`${name} is not exported`);
  return match[1];
}
const fs = await import("node:fs");
const protocol = await import(protocolChunk);
const processProtocol = await import(processChunk);
const protocolSource = fs.readFileSync(new URL(protocolChunk), "utf8");
const processSource = fs.readFileSync(new URL(processChunk), "utf8");
const validate = protocol[exported(protocolSource, "validateNodeWorkerLaunchInput")];
const planHash = protocol[exported(protocolSource, "nodeWorkerPlanHash")];
const parseReceipt = protocol[exported(protocolSource, "parseNodeWorkerSupervisorReceipt")];
const parseResult = processProtocol[exported(processSource, "parseWorkerProcessResult")];
let input = "";
for await (const chunk of process.stdin) input += chunk;
const cases = JSON.parse(input);
const answers = cases.map((item) => {
  try {
    if (item.kind === "launch") return { ok: true, planHash: planHash(validate(structuredClone(item.value))) };
    if (item.kind === "receipt") return { ok: parseReceipt(item.value) !== null };
    return { ok: parseResult(item.value) !== null };
  } catch (error) {
    return { ok: false, error: String(error.message) };
  }
});
process.stdout.write(JSON.stringify(answers));
"""


def _chunk(prefix: str) -> Path:
    found = sorted(openclaw_dist().glob(f"{prefix}-*.mjs"))
    assert found, f"no {prefix} chunk in {openclaw_dist()}"
    return found[0]


def openclaw_checks(cases: list[dict]) -> list[dict]:
    """OpenClaw's verdict on each case (``kind`` launch / receipt / result, ``value``)."""
    node = node_binary()
    done = subprocess.run(
        [
            str(node),
            "--input-type=module",
            "-e",
            SCRIPT,
            _chunk("node-supervisor-protocol").as_uri(),
            _chunk("worker-process-protocol").as_uri(),
        ],
        input=json.dumps(cases),  # ASCII JSON: a lone surrogate travels as its escape, as in a frame
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def built(**changes) -> dict:
    arguments = {
        "facts": FACTS,
        "run_id": "0b8f7a52-5c1e-4a43-9d51-2f36f0d3a001",
        "agent_id": "main",
        "session_key": "agent:main:worktree-a",
        "prompt": "Reply exactly: NODE-MARKER",
        "model_provider": "openai",
        "model": "gpt-4o-mini",
        "credential": inference_token("0b8f7a52-5c1e-4a43-9d51-2f36f0d3a001", NODE_ID),
        "namespace": "gateway-0123456789abcdef0123456789abcdef",
    }
    arguments.update(changes)
    return launch_input(**arguments)


def test_the_launch_passes_openclaws_parser_and_its_plan_hash_is_the_nodes():
    tricky = 'quotes " and \\ backslash, emoji 🦞, line\nbreak, tab\t, \u2028 separator, lone \ud800 surrogate, é'
    launches = [
        built(),
        built(prompt=tricky),
        built(session_key=""),  # no session key: the optional field left out
        built(prompt="x" * 200_000),  # cut to what the node's transcript frame budget takes
        rearmed(built(), 1),
        rearmed(built(), 4),
    ]

    answers = openclaw_checks([{"kind": "launch", "value": launch} for launch in launches])

    for launch, answer in zip(launches, answers, strict=True):
        assert answer == {"ok": True, "planHash": launch_identity(launch)["planHash"]}, answer
    assert "sessionKey" not in launches[2]
    assert launches[4]["launchId"] == launches[4]["descriptor"]["assignment"]["turnId"] != launches[0]["launchId"]


def test_openclaws_parser_refuses_what_the_builder_must_never_send():
    """The check has teeth: an unknown key, a relative workspace, or a launch id other than the turn id is
    refused by the node (the builder's own refusals are below)."""
    unknown_key = built()
    unknown_key["version"] = 1
    relative = built()
    relative["descriptor"]["assignment"]["workspaceDir"] = "relative/dir"
    mismatched = built()
    mismatched["launchId"] = "f" * 64

    answers = openclaw_checks([{"kind": "launch", "value": value} for value in (unknown_key, relative, mismatched)])

    assert [answer["ok"] for answer in answers] == [False, False, False]
    assert answers[2]["error"] == "INVALID_REQUEST: launchId must match descriptor assignment turnId"


def test_receipts_and_the_workers_result_line_as_openclaw_parses_them():
    launch = built()
    identity = launch_identity(launch)
    assignment = launch["descriptor"]["assignment"]
    cursors = {
        "transcriptLeafId": assignment["transcript"]["baseLeafId"],
        "transcriptNextSeq": assignment["transcript"]["nextSeq"],
    }
    cases = [
        {"kind": "receipt", "value": {**identity, "state": "running"}},
        {"kind": "receipt", "value": {**identity, "state": "completed", "resultJson": json.dumps(cursors)}},
        {"kind": "receipt", "value": {**identity, "state": "failed", "errorText": "worker exited"}},
        {"kind": "receipt", "value": {**identity, "state": "running", "extra": 1}},
        {
            "kind": "result",
            "value": {
                "type": "result",
                "turnId": assignment["turnId"],
                "result": {"status": "completed", **cursors},
                "retainWorker": False,
            },
        },
    ]

    answers = openclaw_checks(cases)

    assert [answer["ok"] for answer in answers] == [True, True, True, False, True]
    for case, answer in zip(cases[:4], answers[:4], strict=True):
        if answer["ok"]:
            assert turns.checked_receipt(case["value"], identity) == case["value"]
        else:
            with pytest.raises(turns.ReceiptInvalid, match="receipt contract"):
                turns.checked_receipt(case["value"], identity)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"credential": "short"}, "credential bounds"),
        ({"credential": "x" * 257}, "credential bounds"),
        ({"run_id": " padded"}, "run id"),
        ({"run_id": "line\nbreak"}, "run id"),
        ({"model": ""}, "model"),
        ({"facts": LaunchFacts(**{**FACTS.__dict__, "workspace_dir": "relative/dir"})}, "absolute path"),
    ],
)
def test_the_builder_refuses_values_the_node_would_refuse(change, reason):
    with pytest.raises(LaunchRefused, match=re.escape(reason)):
        built(**change)
