"""A reset of a session placed on a worker: the session starts a new transcript generation (a new sessionId) and
keeps its worker; the environment's attachment follows the new id, so recovery still sees its exact owner."""

from __future__ import annotations

import pytest

from sessions_app.models import Session
from sessions_app.services.sessions import session_reset
from workers_app.models import Placement, WorkerEnvironment
from workers_app.services import environments as envs
from workers_app.services.recovery import workers_recovery_sweep

from .test_placement_store import ENV, make_session
from .test_recovery import on_scripted, scripted  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db


def test_a_reset_keeps_the_worker_and_recovery_finds_its_owner(scripted):  # noqa: F811
    session = make_session()
    placement = on_scripted(session)
    epoch = WorkerEnvironment.objects.get(pk=ENV).owner_epoch
    previous = session.session_id

    renewed = session_reset(key=session.key)

    assert renewed.session_id != previous
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert environment.attached_session_ids == [renewed.session_id]
    assert (environment.state, environment.owner_epoch) == ("attached", epoch)  # the same owner, not a new one
    report = workers_recovery_sweep()
    assert report.outcomes["placement:healthy"] == 1
    after = Placement.objects.get(pk=session.pk)
    assert (after.state, after.generation, after.recovery_error) == ("active", placement.generation, None)


def test_an_environment_attached_to_another_id_is_left_alone():
    session = make_session()
    on_scripted(session)
    WorkerEnvironment.objects.filter(pk=ENV).update(attached_session_ids=["someone-else"])

    assert not envs.environment_follow_session(
        environment_id=ENV, previous_session_id=session.session_id, session_id="new"
    )
    assert WorkerEnvironment.objects.get(pk=ENV).attached_session_ids == ["someone-else"]


def test_a_reset_of_a_local_session_touches_no_environment():
    session = make_session()
    on_scripted(session)
    other = make_session("agent:main:local")

    session_reset(key=other.key)

    assert WorkerEnvironment.objects.get(pk=ENV).attached_session_ids == [Session.objects.get(pk=session.pk).session_id]
