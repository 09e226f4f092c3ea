"""A turn on OpenClaw's node host (node-worker-dialect.md §1.6–§1.8, §3.5 option B, §3.6).

OpenClaw's node does not stream a launch: ``worker.launch.v1`` answers at once with a durable receipt, the
gateway polls ``worker.status.v1`` until the receipt is terminal, and cancels with ``worker.cancel.v1`` and the
launch's full identity until it is. The node spawns this gateway's worker (``workers_app/openclaw_worker``),
which fetches its launch, asks the model and reports its progress and exec questions over HTTP
(``worker_routes``); the routes pass those on, through the channel layer, to the thread running the turn
(another process, perhaps), which handles them as any node turn's (:mod:`workers_app.nodes.turn_watch`).

The outcome is the worker's ``end`` item once the receipt is terminal ``completed``; its process result only
echoes the transcript cursors the launch gave it (the gateway owns the transcript).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer

from gateway import publisher
from gateway.invoke import InvokeTarget, NodeCommandFailed
from gateway.node_commands import is_private_node_command
from openclaw_client.agent.loop import Approval
from sessions_app.services.runs import TurnOutcome

from ...models import Placement, PlacementState, WorkerEnvironment
from ..turn_lookups import NodeTurnPlace
from ..turn_tokens import inference_token
from ..turn_watch import WatchedNodeTurn, offline_outcome
from .calls import invoke_openclaw
from .dialect import gateway_namespace, node_session_id, node_speaks_openclaw

logger = logging.getLogger(__name__)

LAUNCH_COMMAND = "worker.launch.v1"
STATUS_COMMAND = "worker.status.v1"
CANCEL_COMMAND = "worker.cancel.v1"
DESCRIPTOR_VERSION = 4
RPC_SET_VERSION = 1
# OpenClaw's gateway side of the launch (node-launch-adapter): each RPC's budget, the status poll's pace,
# how long a node may take to take the launch at all, and how long a cancel may take to settle.
RPC_TIMEOUT_MS = 30_000
POLL_FIRST_S = 0.25
POLL_MAX_S = 2.0
# How often a pause between polls looks whether the worker ended or the turn was aborted.
WAKE_CHECK_S = 0.05
AVAILABILITY_S = 10.0
CANCEL_DEADLINE_S = 30.0
# A worker that could not reach the gateway in time ends ``not-started``/``admission-deadline``: the launch is
# armed again under a new launch id, a few times, backing off.
MAX_ADMISSION_ATTEMPTS = 5
REARM_FIRST_S = 1.0
REARM_MAX_S = 30.0
# A node that lost its connection mid-turn keeps the turn's receipt: polls go on while it may come back.
RECONNECT_GRACE_S = 30.0
# Transport codes after which OpenClaw's gateway asks again rather than fail.
RETRYABLE_CODES = frozenset(
    {
        "DISCONNECTED",
        "NOT_CONNECTED",
        "PAIRING_CHANGED",
        "PRIVATE_DIALECT_UNAVAILABLE",
        "ROUTE_CHANGED",
        "TIMEOUT",
        "UNAVAILABLE",
    }
)
TERMINAL_STATES = frozenset({"completed", "failed", "interrupted", "cancelled"})
IDENTITY_KEYS = ("launchId", "planHash", "environmentId", "sessionId", "ownerEpoch", "placementGeneration", "runId")
RESULT_JSON_MAX_BYTES = 65_536
ERROR_TEXT_MAX_BYTES = 4096
PLAN_HASH = re.compile(r"[a-f0-9]{64}")
# The descriptor's prompt is informational (the worker fetches the whole context from its launch route), but
# OpenClaw's node refuses one whose transcript frame would exceed 64 KiB: a long message is cut for it.
PROMPT_MAX_BYTES = 60_000
# The credential's bounds in OpenClaw's admission schema.
CREDENTIAL_MIN_CHARS, CREDENTIAL_MAX_CHARS = 16, 256
# After a terminal receipt, progress the worker sent before it exited may still be on its way through the
# channel layer: the turn waits for its ``end`` item this long past the last item it saw.
DRAIN_QUIET_S = 1.0
NO_OUTCOME = "device worker exited without reporting its outcome"
CHANNEL_PREFIX = "openclaw-worker-turn."
ITEMS_MESSAGE = "openclaw.worker.items"
APPROVAL_MESSAGE = "openclaw.worker.approval"
DECISION_MESSAGE = "openclaw.worker.decision"


def turn_speaks_openclaw(place: NodeTurnPlace) -> bool:
    """Whether the node's live connection speaks OpenClaw's dialect (the project's node host lists its private
    commands, which answers without a query: its turns ask on every launch)."""
    if place.route is None or any(is_private_node_command(command) for command in place.route.commands):
        return False
    return node_speaks_openclaw(place.node_id)


def turn_channel(run_id: str) -> str:
    """The channel the worker routes deliver a run's items on (any process may send, the turn receives)."""
    return CHANNEL_PREFIX + hashlib.sha256(run_id.encode()).hexdigest()[:40]


# --- the launch input ------------------------------------------------------------------------------


class LaunchRefused(Exception):
    """The launch cannot be built for OpenClaw's node (a value its strict schemas would refuse)."""


@dataclass(frozen=True)
class LaunchFacts:
    """What the launch names of the placement and its environment, read on the turn's thread."""

    environment_id: str
    session_id: str
    owner_epoch: int
    placement_generation: int
    workspace_dir: str
    build: dict[str, Any]  # the installed bundle's build identity: bundleHash, openclawVersion, protocolFeatures


def launch_facts(session_pk: int, environment_id: str) -> LaunchFacts:
    """What the launch names; the session by the id its workspace was synced under (unchanged by a reset)."""
    placement = (
        Placement.objects.filter(pk=session_pk, state=PlacementState.ACTIVE, environment_id=environment_id)
        .only("generation", "active_owner_epoch", "remote_workspace_dir")
        .first()
    )
    environment = (
        WorkerEnvironment.objects.filter(pk=environment_id)
        .only(
            "bootstrap_bundle_hash",
            "bootstrap_openclaw_version",
            "bootstrap_protocol_features",
            "attached_session_ids",
            "workspace_session_id",
        )
        .first()
    )
    session_id = node_session_id(environment) if environment is not None else None
    if placement is None or environment is None or session_id is None:
        raise LaunchRefused("the session's placement is no longer active on this environment")
    if not environment.bootstrap_bundle_hash or not environment.bootstrap_openclaw_version:
        raise LaunchRefused("the environment has no installed worker bundle")
    if not placement.remote_workspace_dir or not placement.active_owner_epoch:
        raise LaunchRefused("the placement has no synchronized workspace")
    return LaunchFacts(
        environment_id=environment_id,
        session_id=session_id,
        owner_epoch=placement.active_owner_epoch,
        placement_generation=placement.generation,
        workspace_dir=placement.remote_workspace_dir,
        build={
            "bundleHash": environment.bootstrap_bundle_hash,
            "openclawVersion": environment.bootstrap_openclaw_version,
            "protocolFeatures": list(environment.bootstrap_protocol_features or []),
        },
    )


def _identifier(value: str) -> bool:
    """OpenClaw's bounded identifier: 1–256 characters, no surrounding whitespace, no line breaks or NUL."""
    return 0 < len(value) <= 256 and value.strip() == value and not re.search(r"[\x00-\x1f]", value)


def first_launch_id(namespace: str, run_id: str) -> str:
    """The run's launch id on the node: stable for the run, distinct between gateways sharing a node."""
    return hashlib.sha256(f"{namespace}:{run_id}".encode()).hexdigest()


def descriptor_prompt(text: str) -> str:
    while len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) > PROMPT_MAX_BYTES:
        text = text[: len(text) * 9 // 10]
    return text or " "


def launch_input(
    *,
    facts: LaunchFacts,
    run_id: str,
    agent_id: str,
    session_key: str,
    prompt: str,
    model_provider: str,
    model: str,
    credential: str,
    namespace: str,
) -> dict[str, Any]:
    """``worker.launch.v1``'s params (OpenClaw's ``LaunchInput`` with a version-4 descriptor).

    The transcript and live-event cursors are the first of an empty history: the worker's process result echoes
    them (valid in both OpenClaw schemas), while the messages themselves go through this gateway's routes."""
    if not CREDENTIAL_MIN_CHARS <= len(credential) <= CREDENTIAL_MAX_CHARS:
        raise LaunchRefused("the turn's inference token does not fit OpenClaw's credential bounds")
    for name, value in (("run id", run_id), ("agent id", agent_id), ("model", model)):
        if not _identifier(value):
            raise LaunchRefused(f"the {name} is not an identifier OpenClaw's node accepts")
    workspace = facts.workspace_dir
    if not workspace.startswith("/") or len(workspace) > 4096 or workspace.strip() != workspace or "\x00" in workspace:
        raise LaunchRefused("the node's workspace directory is not an absolute path")
    launch_id = first_launch_id(namespace, run_id)
    params: dict[str, Any] = {
        "environmentSession": 1,
        "launchId": launch_id,
        "gatewayNamespace": namespace,
        "expectedBundleHash": facts.build["bundleHash"],
        "placementGeneration": facts.placement_generation,
        "descriptor": {
            "version": DESCRIPTOR_VERSION,
            "admission": {
                "environmentId": facts.environment_id,
                "credential": credential,
                "sessionId": facts.session_id,
                "ownerEpoch": facts.owner_epoch,
                "rpcSetVersion": RPC_SET_VERSION,
                "handshake": facts.build,
            },
            "assignment": {
                "agentId": agent_id,
                "operationalRunInstance": {"instanceId": launch_id, "runId": run_id},
                "agentRuntimeIdentityToken": f"{namespace}:{launch_id}",
                "runId": run_id,
                "turnId": launch_id,
                "prompt": descriptor_prompt(prompt),
                # The gateway recorded the user's message when it claimed the run.
                "suppressPromptTranscript": True,
                "workspaceDir": facts.workspace_dir,
                "modelRef": {"provider": model_provider if _identifier(model_provider) else "gateway", "model": model},
                "inferenceOptions": {},
                "initialMessages": [],
                "transcript": {"baseLeafId": None, "nextSeq": 1},
                "liveEvents": {"ackedSeq": 0, "nextSeq": 1},
                "toolAuthority": {"allowedToolNames": []},
            },
        },
    }
    if 0 < len(session_key) <= 1024 and session_key.strip() == session_key and "\x00" not in session_key:
        params["sessionKey"] = session_key
    return params


def rearmed(original: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The launch armed again after its worker missed its admission deadline (OpenClaw's re-arm: a new launch
    id derived from the first, the descriptor's turn id with it)."""
    launch_id = hashlib.sha256(f"{original['launchId']}:admission-rearm:{attempt}".encode()).hexdigest()
    descriptor = original["descriptor"]
    return {
        **original,
        "launchId": launch_id,
        "descriptor": {**descriptor, "assignment": {**descriptor["assignment"], "turnId": launch_id}},
    }


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def stable_json(value: Any) -> str:
    """OpenClaw's ``stableStringify`` of JSON values: object keys sorted, no whitespace, strings as
    ``JSON.stringify`` writes them (which escapes a lone surrogate)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_js_string(key)}:{stable_json(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(stable_json(item) for item in value) + "]"
    if isinstance(value, str):
        return _js_string(value)
    return json.dumps(value)


def _js_string(text: str) -> str:
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", json.dumps(text, ensure_ascii=False))


def plan_hash(params: dict[str, Any]) -> str:
    """The launch's ``planHash`` as OpenClaw's node computes it (``nodeWorkerPlanHash``)."""
    plan: dict[str, Any] = {
        "expectedBundleHash": params["expectedBundleHash"],
        "descriptor": params["descriptor"],
        "gatewayNamespace": params["gatewayNamespace"],
        "placementGeneration": params["placementGeneration"],
    }
    if "sessionKey" in params:
        plan["sessionKey"] = params["sessionKey"]
    return hashlib.sha256(stable_json(plan).encode("utf-8", "surrogatepass")).hexdigest()


def launch_identity(params: dict[str, Any]) -> dict[str, Any]:
    """The identity every receipt of this launch must carry, and ``worker.cancel.v1``'s params."""
    admission = params["descriptor"]["admission"]
    return {
        "launchId": params["launchId"],
        "planHash": plan_hash(params),
        "environmentId": admission["environmentId"],
        "sessionId": admission["sessionId"],
        "ownerEpoch": admission["ownerEpoch"],
        "placementGeneration": params["placementGeneration"],
        "runId": params["descriptor"]["assignment"]["runId"],
    }


# --- receipts ------------------------------------------------------------------------------------


class ReceiptInvalid(Exception):
    """The node answered with something that is not a receipt of this launch."""


def checked_receipt(value: Any, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The node's answer as a receipt of the launch ``expected`` names (None: the node knows no such launch)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReceiptInvalid("node worker supervisor response violated the private receipt contract")
    state = value.get("state")
    extra = {"completed": "resultJson"}.get(state) if state in ("completed", "pending", "running") else "errorText"
    keys = {*IDENTITY_KEYS, "state"} | ({extra} if extra else set())
    if state not in TERMINAL_STATES | {"pending", "running"} or set(value) != keys:
        raise ReceiptInvalid("node worker supervisor response violated the private receipt contract")
    if state == "completed" and not _result_json(value.get("resultJson")):
        raise ReceiptInvalid("node worker supervisor response violated the private receipt contract")
    if extra == "errorText" and not _error_text(value.get("errorText")):
        raise ReceiptInvalid("node worker supervisor response violated the private receipt contract")
    if any(value.get(key) != expected[key] or type(value.get(key)) is not type(expected[key]) for key in IDENTITY_KEYS):
        raise ReceiptInvalid("node worker supervisor receipt identity mismatch")
    return value


def _result_json(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, str) or not value or len(value.encode("utf-8", "surrogatepass")) > RESULT_JSON_MAX_BYTES:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _error_text(value: Any) -> bool:
    return (
        isinstance(value, str)
        and bool(value)
        and len(value.encode("utf-8", "surrogatepass")) <= ERROR_TEXT_MAX_BYTES
        and "\n" not in value
        and "\r" not in value
    )


def missed_admission(receipt: dict[str, Any]) -> bool:
    """A completed receipt whose worker never started its turn: it could not reach the gateway in time."""
    result = _result_json(receipt.get("resultJson")) if receipt["state"] == "completed" else None
    return bool(result and result.get("status") == "not-started" and result.get("reason") == "admission-deadline")


# --- the launch, polled ----------------------------------------------------------------------------


class LaunchAbandoned(Exception):
    """The turn was aborted before the node took its launch: nothing runs there."""


Invoke = Callable[..., Awaitable[Any]]
Sleep = Callable[[float], Awaitable[Any]]


class LaunchWatch:
    """``worker.launch.v1``, then ``worker.status.v1`` until the receipt is terminal, as OpenClaw's gateway
    drives it (``createNodeWorkerLaunchAdapter``): re-armed on a missed admission, cancelled with the launch's
    identity until terminal once :attr:`cancel_requested` says so. :meth:`wake` polls at once (the worker said
    it ended). Runs on the channel layer's loop; ``invoke`` and ``sleep`` are the transport and the clock."""

    def __init__(
        self,
        node_id: str,
        params: dict[str, Any],
        *,
        cancel_requested: Callable[[], bool],
        target: InvokeTarget | None = None,
        invoke: Invoke | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] | None = None,
    ):
        self.node_id = node_id
        self.original = params
        self.params = params
        self.expected = launch_identity(params)
        self.cancel_requested = cancel_requested
        self.target = target
        self.invoke = invoke or invoke_openclaw
        self.sleep = sleep
        self.clock = clock or (lambda: asyncio.get_running_loop().time())
        self.attempts = 1
        self.woken = False
        self.worker_ended = False

    def wake(self) -> None:
        """The worker reported its end: poll now, and at the first pace until the receipt says so too."""
        self.woken = True
        self.worker_ended = True

    async def run(self) -> dict[str, Any]:
        """The launch's terminal receipt; raises :class:`NodeCommandFailed` (capacity, a refusal, a node that
        did not come back), :class:`ReceiptInvalid` or :class:`LaunchAbandoned`."""
        available_until = self.clock() + AVAILABILITY_S
        lost_since: float | None = None
        taken = False  # the node answered with a receipt: the launch may run there
        poll_status = False
        delay = POLL_FIRST_S
        while True:
            if self.cancel_requested():
                if not taken:
                    raise LaunchAbandoned
                return await self.cancel_until_terminal()
            try:
                receipt = await self._ask(poll_status)
            except NodeCommandFailed as failure:
                if failure.code not in RETRYABLE_CODES:
                    raise
                now = self.clock()
                if not taken and (failure.code == "NOT_CONNECTED" or now >= available_until):
                    raise  # the node never took it: runner-offline, as for a node that was not connected
                lost_since = lost_since if lost_since is not None else now
                if taken and now - lost_since >= RECONNECT_GRACE_S:
                    raise
                poll_status = False  # ask again with the launch itself: the node answers it by its launch id
            else:
                lost_since = None
                if receipt is None:
                    poll_status = False
                else:
                    taken = True
                    if receipt["state"] in TERMINAL_STATES:
                        if missed_admission(receipt) and self.attempts < MAX_ADMISSION_ATTEMPTS:
                            await self.sleep(min(REARM_FIRST_S * 2 ** (self.attempts - 1), REARM_MAX_S))
                            self._rearm()
                            taken, poll_status, delay = False, False, POLL_FIRST_S
                            available_until = self.clock() + AVAILABILITY_S
                            continue
                        return receipt
                    if not poll_status:
                        delay = POLL_FIRST_S
                    poll_status = True
            await self._pause(delay)
            delay = POLL_FIRST_S if self.worker_ended else min(delay * 2, POLL_MAX_S)

    def _rearm(self) -> None:
        self.params = rearmed(self.original, self.attempts)
        self.attempts += 1
        self.expected = launch_identity(self.params)

    async def _ask(self, poll_status: bool) -> dict[str, Any] | None:
        if poll_status:
            answer = await self.invoke(
                self.node_id,
                STATUS_COMMAND,
                {"launchId": self.params["launchId"]},
                timeout_ms=RPC_TIMEOUT_MS,
                target=None,  # the node's connection now: it may have reconnected since the launch
            )
        else:
            answer = await self.invoke(
                self.node_id,
                LAUNCH_COMMAND,
                self.params,
                timeout_ms=RPC_TIMEOUT_MS,
                idempotency_key=self.params["launchId"],
                target=self.target,
            )
            self.target = None  # a launch sent again goes to the node's connection of then
        return checked_receipt(answer, self.expected)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less once woken (the worker reported its end) or asked to cancel."""
        steps = max(1, round(seconds / WAKE_CHECK_S))
        for _ in range(steps):
            if self.woken:
                self.woken = False  # one wake, one poll (one that came during the last poll counts too)
                return
            if self.cancel_requested():
                return
            await self.sleep(seconds / steps)

    async def cancel_until_terminal(self) -> dict[str, Any]:
        """``worker.cancel.v1`` with the launch's identity until the node's receipt is terminal (OpenClaw's
        ``cancelUntilTerminal``, at most :data:`CANCEL_DEADLINE_S`)."""
        deadline = self.clock() + CANCEL_DEADLINE_S
        delay = POLL_FIRST_S
        while self.clock() < deadline:
            try:
                answer = await self.invoke(
                    self.node_id,
                    CANCEL_COMMAND,
                    dict(self.expected),
                    timeout_ms=min(RPC_TIMEOUT_MS, max(1, int((deadline - self.clock()) * 1000))),
                    target=None,
                )
            except NodeCommandFailed as failure:
                if failure.code not in RETRYABLE_CODES:
                    raise
            else:
                receipt = checked_receipt(answer, self.expected)
                if receipt is not None and receipt["state"] in TERMINAL_STATES:
                    return receipt
            await self.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
        raise NodeCommandFailed(
            "UNAVAILABLE", "node worker cancellation did not produce a terminal receipt before its deadline"
        )


# --- the turn ------------------------------------------------------------------------------------


class OpenClawNodeTurn(WatchedNodeTurn):
    """A node turn on OpenClaw's node host: launched and polled here, reported by the worker over HTTP."""

    params: dict[str, Any] | None = None
    refused: str = ""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.channel = turn_channel(self.run_id)
        self.end_result: dict[str, Any] | None = None
        self.decisions: dict[str, Approval] = {}
        self.receipt: dict[str, Any] | None = None

    def _prepare(self) -> None:
        try:
            facts = launch_facts(self.record.session_id, self.place.environment_id)
            self.params = launch_input(
                facts=facts,
                run_id=self.run_id,
                agent_id=self.agent_id,
                session_key=self.session_key,
                prompt=self.record.message,
                model_provider=self.provider_name,
                model=self.model,
                credential=inference_token(self.run_id, self.node_id),
                namespace=gateway_namespace(),
            )
        except LaunchRefused as refused:
            self.refused = str(refused)

    async def _launch(self) -> Any:
        """On the channel layer's loop: the launch watched to its terminal receipt while the worker's items are
        received; returns the worker's ``end`` result (or raises why there is none)."""
        if self.params is None:
            raise NodeCommandFailed("INVALID_REQUEST", f"the launch could not be built: {self.refused}")
        watch = LaunchWatch(self.node_id, self.params, cancel_requested=self.cancel.is_set, target=self.target)
        layer = get_channel_layer()
        activity = {"at": asyncio.get_running_loop().time()}
        ended = asyncio.Event()
        receiving = asyncio.ensure_future(self._receive(layer, watch, activity, ended))
        try:
            try:
                receipt = await watch.run()
            except LaunchAbandoned:
                return {"status": "aborted", "text": self.text}
            except ReceiptInvalid as invalid:
                logger.warning("node %s answered the launch of run %s wrongly: %s", self.node_id, self.run_id, invalid)
                return _failure(f"device worker turn failed: {invalid}", "unknown")
            self.receipt = receipt
            if receipt["state"] == "completed" and not missed_admission(receipt):
                await self._drain(activity, ended)
        finally:
            receiving.cancel()
            await asyncio.gather(receiving, return_exceptions=True)
        return self._receipt_result(receipt)

    async def _receive(self, layer: Any, watch: LaunchWatch, activity: dict[str, float], ended: asyncio.Event) -> None:
        """The worker's items as the routes deliver them, in order: ``end`` is kept for the outcome (and wakes
        the poll), everything else goes to the turn's thread."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                message = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The channel layer failed (Redis gone): the turn ends on its receipt, without what was lost.
                logger.exception("receiving the worker's items of run %s failed", self.run_id)
                return
            activity["at"] = loop.time()
            if message.get("type") == APPROVAL_MESSAGE:
                question = message.get("question")
                if isinstance(question, dict):
                    self.progress.put({**question, "kind": "approval", "reply": message.get("reply")})
                continue
            if message.get("type") != ITEMS_MESSAGE:
                continue
            for item in message.get("items") or ():
                if not isinstance(item, dict):
                    continue
                if item.get("kind") == "end":
                    if self.end_result is None and isinstance(item.get("result"), dict):
                        self.end_result = item["result"]
                        ended.set()
                        watch.wake()
                else:
                    self.progress.put(item)

    async def _drain(self, activity: dict[str, float], ended: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while self.end_result is None:
            quiet_for = loop.time() - max(activity["at"], started)
            if quiet_for >= DRAIN_QUIET_S:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), DRAIN_QUIET_S - quiet_for)

    def _receipt_result(self, receipt: dict[str, Any]) -> dict[str, Any]:
        """The turn's result from its terminal receipt and what the worker reported."""
        state = receipt["state"]
        if state == "completed":
            if missed_admission(receipt):
                reason = _result_json(receipt["resultJson"]).get("errorText")
                detail = f": {reason}" if isinstance(reason, str) and reason else ""
                return _failure(f"device worker could not reach the gateway{detail}", "worker-unreachable")
            if self.end_result is not None:
                return self.end_result
            if self.cancel.is_set():
                return {"status": "aborted", "text": self.text}
            return _failure(NO_OUTCOME, "unknown")
        if state == "cancelled" or (self.cancel.is_set() and self.end_result is None):
            return {"status": "aborted", "text": self.text}
        if self.end_result is not None and self.end_result.get("status") == "aborted":
            return self.end_result
        return _failure(f"device worker turn {state}: {receipt['errorText']}", "unknown")

    def _answer_exec_question(self, data: dict[str, Any]) -> None:
        """A question asked again (its route gave up waiting) gets the decision already made."""
        call_id = str(data.get("toolCallId", ""))[:200]
        decided = self.decisions.get(call_id)
        if decided is not None:
            self._deliver_decision(call_id, decided, data)
            return
        super()._answer_exec_question(data)

    def _deliver_decision(self, call_id: str, decision: Approval, question: dict[str, Any]) -> None:
        self.decisions[call_id] = decision
        reply = question.get("reply")
        if not isinstance(reply, str) or not reply:
            return
        answer = {
            "type": DECISION_MESSAGE,
            "toolCallId": call_id,
            "allowed": decision.allowed,
            "aborted": decision.aborted,
            "reason": decision.reason,
        }
        # The route that asked may have given up meanwhile (its worker asks again and is answered from
        # ``decisions``): what reaches its channel then expires unread.
        publisher.post(lambda: get_channel_layer().send(reply, answer), what=f"exec decision of run {self.run_id}")

    def _failed(self, failure: NodeCommandFailed) -> TurnOutcome:
        if failure.code in RETRYABLE_CODES - {"NOT_CONNECTED", "TIMEOUT", "UNAVAILABLE"}:
            return offline_outcome(self.provider_name, self.model)
        return super()._failed(failure)


def _failure(message: str, kind: str) -> dict[str, Any]:
    return {"status": "error", "error": {"kind": kind, "message": message}}
