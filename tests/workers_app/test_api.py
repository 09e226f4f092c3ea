"""The placements and environments JSON API, full stack through Django's test client: token auth, the
RPC's services and payloads, keyset pages, and every refusal with its status, exact message and no
change (:func:`refused`).

Transactional: the operations that may wait on a worker provider (move, reclaim, destroy) run in a
pool thread with a database connection of its own, which must see what the test wrote.
"""

from __future__ import annotations

import asyncio

import pytest
from django.test import Client

from devices_app import selectors as device_selectors
from gateway.models import AuditLog
from sessions_app import rpc as session_rpc
from sessions_app import selectors as session_selectors
from sessions_app.schemas import SessionsDescribeParams
from sessions_app.services.sessions import session_patch
from tests.support.api import API_TOKEN
from workers_app import rpc, selectors
from workers_app.models import Placement, PlacementState, WorkerEnvironment
from workers_app.operations import AUTO_DEVICE_FAILED
from workers_app.schemas import EnvironmentsListParams, EnvironmentsStatusParams, SessionsDispatchParams
from workers_app.services import dispatch as dispatch_service
from workers_app.services import placements as store
from workers_app.services.placements import FORCED_WORKER_ABANDONMENT_ERROR, Actor

from . import test_rpc
from .test_device_provider import HOSTING, declare
from .test_placement_store import ENV, dispatch_to_active, make_session
from .test_rpc import MOVE_FAILED, NODE, ctx, failed_without_environment, paired_node, world

pytestmark = pytest.mark.django_db(transaction=True)

# The worker RPC tests' fixtures: profiles installed for one test, in-process dispatch tasks, a provider
# that cannot release leases.
use_profiles = test_rpc.use_profiles
dev_profile = test_rpc.dev_profile
in_process = test_rpc.in_process
destroy_fails = test_rpc.destroy_fails

S = PlacementState
KEY = "agent:main:placed"
TWO_TARGETS = "choose exactly one dispatch target: autoDevice, deviceId, or profileId"


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {API_TOKEN}"})


def refused(response, status: int, message: str, *, before: dict, code: str = "INVALID_REQUEST") -> None:
    """The answer is the error shape with exactly this status, code and message, and nothing changed."""
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert (error["code"], error["message"]) == (code, message)
    assert world() == before


def expected(placement: Placement) -> dict:
    return {"generation": placement.generation, "environmentId": ENV, "ownerEpoch": placement.active_owner_epoch}


# --- auth -------------------------------------------------------------------------------------------


def test_every_route_needs_the_gateway_token():
    session = make_session()
    placement = dispatch_to_active(session)
    before = world()
    routes = [
        ("get", "/api/workers/placements", None),
        ("get", f"/api/workers/placements/{KEY}", None),
        ("post", f"/api/workers/placements/{KEY}/dispatch", {"profileId": "dev"}),
        (
            "post",
            f"/api/workers/placements/{KEY}/move",
            {"expected": expected(placement), "target": {"kind": "gateway"}},
        ),
        ("post", f"/api/workers/placements/{KEY}/reclaim", {}),
        ("post", f"/api/workers/placements/{KEY}/recover", {"expectedGeneration": placement.generation}),
        ("get", "/api/workers/environments", None),
        ("get", f"/api/workers/environments/{ENV}", None),
        ("delete", f"/api/workers/environments/{ENV}?force=true", None),
    ]
    for token in (None, "wrong"):
        client = Client(headers={"Authorization": f"Bearer {token}"} if token else {})
        for verb, url, body in routes:
            response = getattr(client, verb)(url, body, content_type="application/json")
            assert response.status_code == 401, (verb, url)
            assert response.json()["error"]["code"] == "INVALID_REQUEST"
    assert world() == before


# --- one session's placement -------------------------------------------------------------------------


def test_a_session_never_dispatched_is_local_and_a_bare_key_names_the_default_agent(client):
    session = make_session()

    response = client.get("/api/workers/placements/placed")

    assert response.status_code == 200
    assert response.json() == {"ok": True, "key": KEY, "sessionId": session.session_id, "placement": {"state": "local"}}


def test_a_placement_is_the_projection_sessions_describe_shows(client):
    session = make_session()
    dispatch_to_active(session)

    body = client.get(f"/api/workers/placements/{KEY}").json()

    assert body == selectors.placement_result(session)
    assert body["placement"] == session_selectors.session_row(session)["placement"]
    assert (body["placement"]["state"], body["placement"]["generation"]) == (S.ACTIVE, 5)
    assert (body["placement"]["environmentId"], body["placement"]["activeOwnerEpoch"]) == (ENV, 1)


def test_an_unknown_or_malformed_session_key_is_refused(client):
    before = world()
    refused(
        client.get("/api/workers/placements/agent:main:nope"), 404, "session not found: agent:main:nope", before=before
    )
    refused(client.get("/api/workers/placements/agent::x"), 400, "invalid session key: agent::x", before=before)


# --- the placement list ------------------------------------------------------------------------------


def three_placements() -> tuple:
    """``local`` (oldest change), ``failed``, ``active`` (newest change)."""
    local, failed, active = make_session("agent:main:a"), make_session("agent:main:b"), make_session("agent:main:c")
    store.placement_ensure_local(session=local)
    failed_without_environment(failed)
    dispatch_to_active(active)
    for at, session in enumerate((local, failed, active), start=1):
        Placement.objects.filter(pk=session.pk).update(updated_at_ms=1000 * at)
    return local, failed, active


def keys_of(page: dict) -> list[str]:
    return [row["key"] for row in page["placements"]]


def test_the_list_pages_most_recent_change_first_with_a_cursor(client, django_assert_max_num_queries):
    _, failed, active = three_placements()

    with django_assert_max_num_queries(2):
        first = client.get("/api/workers/placements", {"limit": 2})
    assert first.status_code == 200
    page = first.json()
    assert keys_of(page) == ["agent:main:c", "agent:main:b"]
    assert page["placements"][0]["placement"] == selectors.placement_result(active)["placement"]
    assert page["placements"][1] == {
        "key": "agent:main:b",
        "sessionId": failed.session_id,
        "placement": selectors.placement_result(failed)["placement"],
    }
    assert page["nextCursor"]

    last = client.get("/api/workers/placements", {"limit": 2, "cursor": page["nextCursor"]}).json()
    assert (keys_of(last), last["nextCursor"]) == (["agent:main:a"], None)


def test_a_placement_that_changes_between_pages_is_not_shown_twice(client):
    _, _, active = three_placements()
    first = client.get("/api/workers/placements", {"limit": 1}).json()
    assert keys_of(first) == ["agent:main:c"]

    Placement.objects.filter(pk=active.pk).update(updated_at_ms=9000)  # changed again: now newest of all
    rest = client.get("/api/workers/placements", {"limit": 5, "cursor": first["nextCursor"]}).json()

    assert keys_of(rest) == ["agent:main:b", "agent:main:a"]


def test_the_list_filters_by_state_and_environment(client):
    three_placements()

    assert keys_of(client.get("/api/workers/placements", {"state": "failed"}).json()) == ["agent:main:b"]
    assert keys_of(client.get("/api/workers/placements", {"environmentId": ENV}).json()) == ["agent:main:c"]
    assert keys_of(client.get("/api/workers/placements", {"state": "reclaimed"}).json()) == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"cursor": "not-a-cursor"}, "invalid cursor"),
        ({"cursor": "WyJ4IiwxXQ"}, "invalid cursor"),  # ["x",1]: the right length, the wrong types
        ({"state": "lost"}, None),
        ({"limit": 0}, None),
        ({"limit": 501}, None),
    ],
)
def test_a_bad_cursor_or_filter_is_refused(client, query, message):
    three_placements()
    before = world()

    response = client.get("/api/workers/placements", query)

    assert response.status_code == 400
    error = response.json()["error"]
    if message is not None:
        assert error == {"code": "INVALID_REQUEST", "message": message}
    else:
        assert error["message"].startswith("invalid request: at /") and "(query)" in error["message"]
    assert world() == before


# --- dispatch ----------------------------------------------------------------------------------------


def dispatch(client: Client, key: str = KEY, **body):
    return client.post(f"/api/workers/placements/{key}/dispatch", body, content_type="application/json")


def test_dispatch_refusals_name_the_service_reason_and_change_nothing(client):
    make_session()
    before = world()

    refused(
        dispatch(client, "agent:main:nope", deviceId=NODE), 404, "session not found: agent:main:nope", before=before
    )
    refused(dispatch(client, autoDevice=True, profileId="dev"), 400, TWO_TARGETS, before=before)
    refused(dispatch(client, autoDevice=True), 400, AUTO_DEVICE_FAILED, before=before)
    refused(dispatch(client), 400, "worker dispatch target is missing", before=before)
    refused(dispatch(client, profileId="dev"), 400, "cloud worker dispatch is not configured", before=before)
    refused(dispatch(client, deviceId=NODE), 400, f"device worker is not a paired node host: {NODE}", before=before)
    both = dispatch(client, deviceId=NODE, profileId="dev")
    assert both.status_code == 400
    assert TWO_TARGETS in both.json()["error"]["message"]
    assert world() == before


def test_an_archived_session_is_not_dispatched(client, dev_profile):
    session = make_session()
    session_patch(key=session.key, changes={"archived": True})
    before = world()

    refused(dispatch(client, profileId="dev"), 400, "cannot dispatch an archived session", before=before)


def test_an_archived_session_is_refused_for_its_state_when_no_profile_is_configured(client, use_profiles):
    use_profiles({})
    session = make_session()
    session_patch(key=session.key, changes={"archived": True})
    before = world()

    refused(dispatch(client, profileId="dev"), 400, "cannot dispatch an archived session", before=before)


def test_dispatch_to_an_unknown_profile_is_not_found(client, dev_profile):
    make_session()
    before = world()

    response = dispatch(client, profileId="nope")

    refused(response, 404, "worker profile not found: nope", before=before)
    assert response.json()["error"]["details"] == {"code": "profile_not_found"}


def test_dispatch_to_a_node_that_is_not_connected_is_refused(client):
    make_session()
    paired_node(connected=False)
    before = world()

    response = dispatch(client, deviceId=NODE)

    message = f"device worker node is not connected: {NODE}; reconnect it before retrying"
    refused(response, 400, message, before=before)


def test_an_identical_dispatch_joins_the_one_in_flight_and_another_target_is_refused(client, dev_profile, settings):
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "DISPATCH_WAIT_MS": 200}
    session = make_session()
    started, _ = dispatch_service.dispatch_start(session=session, target="profile:dev", actor=Actor("first"))
    before = world()

    joined = dispatch(client, profileId="dev")

    assert joined.status_code == 200
    body = joined.json()
    assert body == asyncio.run(rpc.sessions_dispatch_rpc(ctx(), SessionsDispatchParams(key=KEY, profileId="dev")))
    assert (body["placement"]["state"], body["placement"]["generation"]) == (S.PROVISIONING, started.generation)
    assert world() == before
    refused(
        dispatch(client, profileId="other"), 400, "session cannot dispatch from placement provisioning", before=before
    )


def test_a_dispatch_to_an_unreachable_host_fails_with_its_reason(client, sshd, use_profiles, in_process):
    use_profiles({"dev": {"provider": "static-ssh", "settings": sshd.profile_settings()}})
    sshd.stop()
    session = make_session()

    response = dispatch(client, profileId="dev")

    message = (
        "Worker dispatch failed in provisioning: "
        f"static-ssh host 127.0.0.1:{sshd.port} is unreachable: Connection refused"
    )
    assert response.status_code == 503
    assert response.json()["error"] == {
        "code": "UNAVAILABLE",
        "message": message,
        "details": {"code": "WORKER_DISPATCH_FAILED"},
    }
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.recovery_error) == (S.FAILED, message)
    assert client.get(f"/api/workers/placements/{KEY}").json()["placement"]["recoveryAction"] == "restart"


# --- move --------------------------------------------------------------------------------------------


def move(client: Client, placement_expected: dict, target: dict | None = None, **extra):
    body = {"expected": placement_expected, "target": target or {"kind": "gateway"}, **extra}
    return client.post(f"/api/workers/placements/{KEY}/move", body, content_type="application/json")


def test_a_move_to_the_gateway_ends_local(client):
    session = make_session()
    placement = dispatch_to_active(session)

    response = move(client, expected(placement))

    assert response.status_code == 200
    body = response.json()
    assert (body["key"], body["sessionId"]) == (KEY, session.session_id)
    assert (body["placement"]["state"], body["placement"]["generation"]) == (S.LOCAL, 8)
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"


@pytest.mark.parametrize("stale", [{"generation": 4}, {"environmentId": "worker:other"}, {"ownerEpoch": 2}])
def test_a_move_of_a_placement_that_moved_on_is_a_conflict_and_changes_nothing(client, stale):
    session = make_session()
    placement = dispatch_to_active(session)
    before = world()

    response = move(client, {**expected(placement), **stale})

    refused(response, 409, f"Cannot move stale worker placement for session {session.session_id}", before=before)


def test_move_refusals(client):
    session = make_session()
    before = world()
    local = {"generation": 0, "environmentId": ENV, "ownerEpoch": 1}

    refused(move(client, local), 400, "session cannot move from placement local", before=before)
    bad = move(client, local, target={"kind": "profile", "profileId": "dev"}, abandonSource=True)
    assert bad.status_code == 400
    assert "abandonSource is only valid with the gateway target" in bad.json()["error"]["message"]
    missing = move(client, {"generation": -1, "environmentId": ENV, "ownerEpoch": 1})
    assert missing.status_code == 400
    assert "at /expected/generation (body)" in missing.json()["error"]["message"]
    assert world() == before
    session_patch(key=session.key, changes={"archived": True})
    archived = world()
    refused(move(client, local), 400, "cannot move an archived session", before=archived)


def test_a_move_whose_source_cannot_be_torn_down_is_unavailable_and_can_be_retried(client, destroy_fails):
    session = make_session()
    placement = dispatch_to_active(session)

    failed = move(client, expected(placement))

    assert failed.status_code == 503
    assert failed.json()["error"] == {
        "code": "UNAVAILABLE",
        "message": MOVE_FAILED,
        "details": {"code": "WORKER_MOVE_FAILED"},
        "retryable": True,
    }
    destroy_fails.clear()
    assert move(client, expected(placement)).json()["placement"]["state"] == S.LOCAL


# --- reclaim and recover -----------------------------------------------------------------------------


def reclaim(client: Client):
    return client.post(f"/api/workers/placements/{KEY}/reclaim", content_type="application/json")


def test_reclaim_stops_an_active_worker(client):
    session = make_session()
    dispatch_to_active(session)

    response = reclaim(client)

    assert response.status_code == 200
    assert response.json()["placement"]["state"] == S.RECLAIMED
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"


def test_reclaim_of_a_local_session_is_refused(client):
    make_session()
    before = world()

    refused(reclaim(client), 400, f"Session {KEY} cannot stop cloud worker from placement local", before=before)
    refused(
        client.post(f"/api/workers/placements/{KEY}/reclaim", {}, content_type="application/json"),
        400,
        f"Session {KEY} cannot stop cloud worker from placement local",
        before=before,
    )


def test_recover_needs_the_exact_failed_generation(client):
    session = make_session()
    failed = failed_without_environment(session)
    before = world()
    wrong = failed.generation + 1

    response = client.post(
        f"/api/workers/placements/{KEY}/recover", {"expectedGeneration": wrong}, content_type="application/json"
    )

    message = (
        f"Worker session placement {session.session_id} changed: "
        f"expected failed@{wrong}, found failed@{failed.generation}"
    )
    refused(response, 400, message, before=before)
    recovered = client.post(
        f"/api/workers/placements/{KEY}/recover",
        {"expectedGeneration": failed.generation},
        content_type="application/json",
    )
    assert recovered.status_code == 200
    assert recovered.json()["placement"]["state"] == S.LOCAL
    refused(
        client.post(f"/api/workers/placements/{KEY}/recover", {}, content_type="application/json"),
        400,
        "invalid request: at /expectedGeneration (body): must have required property",
        before=world(),
    )


# --- environments ------------------------------------------------------------------------------------


def test_the_environment_list_and_detail_are_the_rpc_payloads(client, dev_profile):
    session = make_session()
    dispatch_to_active(session)

    listed = client.get("/api/workers/environments", {"projection": "profiles"})
    detail = client.get(f"/api/workers/environments/{ENV}")

    assert listed.status_code == detail.status_code == 200
    rpc_list = rpc.environments_list_rpc(ctx(), EnvironmentsListParams(projection="profiles"))
    assert _without_age(listed.json()) == _without_age(rpc_list)
    assert [row["id"] for row in listed.json()["environments"]] == [ENV]
    assert listed.json()["profiles"] == [
        {"id": "dev", "providerId": "static-ssh"},
        {"id": "other", "providerId": "static-ssh"},
    ]
    rpc_detail = rpc.environments_status_rpc(ctx(), EnvironmentsStatusParams(environmentId=ENV))
    assert _without_age(detail.json()) == _without_age(rpc_detail)
    assert detail.json()["worker"]["attachedSessionIds"] == [session.session_id]


def _without_age(payload: dict) -> dict:
    """The environments' ages grow between two reads."""
    rows = payload.get("environments", [payload])
    for row in rows:
        row.get("worker", {}).pop("ageMs", None)
    return payload


def test_an_unknown_or_overlong_environment_id_is_refused(client):
    before = world()
    refused(
        client.get("/api/workers/environments/worker:nope"),
        404,
        "worker environment not found: worker:nope",
        before=before,
    )
    refused(
        client.delete("/api/workers/environments/worker:nope"),
        404,
        "worker environment not found: worker:nope",
        before=before,
    )
    overlong = client.get("/api/workers/environments/" + "e" * 129)
    assert overlong.status_code == 400
    assert overlong.json()["error"]["message"].startswith("invalid request: at /environmentId (path):")


def test_destroying_an_attached_environment_needs_force(client):
    session = make_session()
    dispatch_to_active(session)
    before = world()

    refused(
        client.delete(f"/api/workers/environments/{ENV}"),
        400,
        f"worker environment {ENV} is attached to a session; stop its cloud worker first or destroy with force",
        before=before,
    )

    forced = client.delete(f"/api/workers/environments/{ENV}?force=true")

    assert forced.status_code == 200
    body = forced.json()
    assert body["ok"] is True
    assert (body["environment"]["status"], body["environment"]["worker"]["state"]) == ("unavailable", "destroyed")
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.recovery_error) == (S.FAILED, FORCED_WORKER_ABANDONMENT_ERROR)
    # Destroyed already: the same call answers the environment as it is.
    again = client.delete(f"/api/workers/environments/{ENV}")
    assert (again.status_code, again.json()["environment"]["worker"]["state"]) == (200, "destroyed")


def test_changes_are_audited_as_the_gateway_token(client):
    session = make_session()
    dispatch_to_active(session)

    reclaim(client)

    assert AuditLog.objects.filter(action="placement.reclaim", actor="api:token", target_id=KEY).exists()


def test_a_turn_for_a_session_whose_worker_failed_is_refused_as_a_conflict(client):
    session = make_session()
    failed_without_environment(session)
    turns = session.runs.count()

    response = client.post(
        f"/api/sessions/{KEY}/messages", {"message": "hi", "wait": False}, content_type="application/json"
    )

    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "UNAVAILABLE",
        "message": f"Session {KEY} worker placement failed: cloud worker disappeared: environment record missing",
        "details": {"code": "PLACEMENT_FAILED", "placementState": "failed"},
    }
    assert session.runs.count() == turns


def test_the_fields_workers_app_adds_to_session_and_node_rows_reach_the_api(client):
    """Session rows carry the placement, node rows the worker host facts: the response schemas document
    the core fields and pass the contributed ones on."""
    session = make_session()
    dispatch_to_active(session)
    paired_node(connected=True)
    declare(HOSTING)

    described = client.get(f"/api/sessions/{KEY}").json()
    listed = client.get("/api/sessions/").json()
    node = client.get(f"/api/gateway/nodes/{NODE}").json()
    nodes = client.get("/api/gateway/nodes").json()["nodes"]
    environments = client.get("/api/workers/environments").json()["environments"]

    assert described == session_rpc.sessions_describe_rpc(ctx(), SessionsDescribeParams(key=KEY))
    assert described["session"]["placement"]["state"] == S.ACTIVE
    assert listed["sessions"][0]["placement"] == described["session"]["placement"]
    assert (node["sessionHost"], node["workerSlots"]) == (True, {"total": 2, "available": 2})
    assert nodes == device_selectors.node_catalog(include_pending=True)
    node_row = next(row for row in environments if row["id"] == f"node:{NODE}")
    assert (node_row["type"], node_row["sessionHost"], node_row["workerSlots"]) == ("node", True, HOSTING["capacity"])
