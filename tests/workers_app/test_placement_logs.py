"""Every placement transition (dispatch steps, failures, recovery) is logged with who made it and why, once it
commits, and so is a worker environment's state change; a transition refused or rolled back leaves no line."""

from __future__ import annotations

import pytest

from gateway.audit import Actor
from gateway.exceptions import Conflict
from workers_app.models import PlacementState
from workers_app.services import environments
from workers_app.services import placements as store

from .test_placement_store import DISPATCH_STEPS, attached_environment, make_session, walk

pytestmark = pytest.mark.django_db

S = PlacementState


def transitions(json_log) -> list[str]:
    return [line["message"] for line in json_log.lines("workers_app.services.placements")]


def test_each_transition_and_a_failure_are_logged_with_actor_and_reason(json_log, django_capture_on_commit_callbacks):
    session = make_session()
    attached_environment(session)

    with django_capture_on_commit_callbacks(execute=True):
        placement = walk(session, DISPATCH_STEPS[:1])
        store.placement_fail(
            session=session,
            recovery_error="cloud worker disappeared",
            expected_generation=placement.generation,
            actor=Actor(label="recovery:sweep:gateway:x"),
        )

    assert transitions(json_log) == [
        "placement of session agent:main:placed: none -> local (generation 0) by gateway: created",
        "placement of session agent:main:placed: local -> requested (generation 1) by gateway: dispatch requested",
        "placement of session agent:main:placed: requested -> provisioning (generation 2) by gateway: -",
        "placement of session agent:main:placed: provisioning -> failed (generation 3) by recovery:sweep:gateway:x: "
        "cloud worker disappeared",
    ]
    assert {line["session_key"] for line in json_log.lines("workers_app.services.placements")} == {"agent:main:placed"}


def test_a_refused_transition_logs_nothing(json_log, django_capture_on_commit_callbacks):
    session = make_session()
    with django_capture_on_commit_callbacks(execute=True):
        placement = store.placement_start_dispatch(session=session)
    logged = transitions(json_log)

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(Conflict):
        store.placement_transition(
            session=session,
            from_state=S.REQUESTED,
            to_state=S.PROVISIONING,
            expected_generation=placement.generation + 7,
            patch={"environment_id": "worker:x"},
        )

    assert transitions(json_log) == logged


def test_a_worker_environments_state_changes_and_teardown_are_logged_with_the_error(
    json_log, django_capture_on_commit_callbacks
):
    session = make_session()
    environment = attached_environment(session)

    with django_capture_on_commit_callbacks(execute=True):
        environments.environment_request_destroy(
            environment_id=environment.pk, terminal_state="failed", error="the worker stopped answering"
        )
        environments.environment_request_destroy(environment_id=environment.pk, terminal_state="failed", error="again")
        environments.environment_finish_destroy(environment_id=environment.pk)

    assert [line["message"] for line in json_log.lines("workers_app.services.environments")] == [
        "worker environment worker:test-env: attached, teardown requested (failed): the worker stopped answering",
        "worker environment worker:test-env: attached -> failed: -",
    ]
