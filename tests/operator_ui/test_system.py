"""The console's System page and the gateway's address ``/`` over HTTP (operator_ui/system_views.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gateway import scopes as sc
from gateway import state
from gateway.models import GatewayProcess
from gateway.protocol import SERVER_VERSION
from operations_app.models import RecordedError
from tests.support.operators import operator_user

# The page runs the readiness checks, whose probes use connections of their own, on both databases.
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    return client


def system_url() -> str:
    return reverse("ui:system")


# --- / --------------------------------------------------------------------------------------------


def test_the_root_sends_a_visitor_to_the_console_login(client):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == reverse("ui:login")


def test_the_root_sends_a_logged_in_operator_to_the_console(operator_client):
    response = operator_client.get("/")

    assert response.status_code == 302
    assert response["Location"] == reverse("ui:home")
    assert operator_client.get(response["Location"])["Location"] == reverse("ui:sessions")


def test_the_root_refuses_a_post(client):
    assert client.post("/").status_code == 405


# --- the System page ------------------------------------------------------------------------------


def test_the_page_shows_processes_connections_checks_and_recent_errors(staff_client, make_device, make_connection):
    this = GatewayProcess.objects.create(
        boot_id=uuid.UUID(state.BOOT_ID),
        hostname="gw-here",
        pid=101,
        started_at=timezone.now() - timedelta(hours=1),
        heartbeat_at=timezone.now(),
    )
    silent = GatewayProcess.objects.create(
        boot_id=uuid.uuid4(),
        hostname="gw-gone",
        pid=202,
        started_at=timezone.now() - timedelta(days=1),
        heartbeat_at=timezone.now() - timedelta(hours=2),
    )
    make_connection(make_device(1))
    make_connection(make_device(2, roles=[sc.ROLE_NODE]), role=sc.ROLE_NODE)
    make_connection(make_device(3, roles=[sc.ROLE_NODE]), role=sc.ROLE_NODE)
    RecordedError.objects.create(
        error_id="0123456789abcdef",
        context="gateway method sessions.list",
        exception_class="OperationalError",
        first_line="server closed the connection unexpectedly",
        occurred_at=datetime(2026, 12, 4, 10, 0, tzinfo=UTC),
        process_boot_id=state.BOOT_ID,
        hostname="gw-here",
        pid=101,
    )

    response = staff_client.get(system_url())

    assert response.status_code == 200
    page = response.content.decode()
    assert SERVER_VERSION in page
    rows = {row.boot_id: row for row in response.context["processes"]}
    assert rows[str(this.boot_id)].this_process and rows[str(this.boot_id)].live
    assert not rows[str(silent.boot_id)].live
    # The fixture's own process holds the three connections.
    held = [row for row in rows.values() if (row.operators, row.nodes) == (1, 2)]
    assert len(held) == 1
    assert "1 operator, 2 nodes" in page
    assert "gw-gone:202" in page and "silent" in page
    assert response.context["readiness"].ready
    for check in ("database", "channelLayer", "broker", "migrations"):
        assert f'<td data-label="Check">{check}</td>' in page
    assert "0123456789abcdef" in page
    assert "gateway method sessions.list" in page
    assert "server closed the connection unexpectedly" in page


def test_an_empty_page_says_what_fills_it(staff_client):
    # Errors other tests provoked in this process may have been recorded on this database, and this test worker's
    # shared gateway (tests/conftest.py, ``gateway``) registers itself there once another test started it. Deleted
    # inside this test's transaction: rolled back after it.
    RecordedError.objects.all().delete()
    GatewayProcess.objects.all().delete()
    page = staff_client.get(system_url()).content.decode()

    assert "No gateway process has registered yet" in page
    assert "No internal errors recorded." in page


def test_the_page_is_for_staff_only(operator_client):
    assert operator_client.get(system_url()).status_code == 403


def test_a_visitor_is_sent_to_the_login(client):
    response = client.get(system_url())

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("ui:login"))


def test_the_nav_links_the_page_for_staff_only(staff_client, django_user_model):
    operator = Client()
    operator.force_login(operator_user("ops2", sc.WRITE))

    assert system_url() in staff_client.get(reverse("ui:sessions")).content.decode()
    assert system_url() not in operator.get(reverse("ui:sessions")).content.decode()


def test_the_page_costs_the_same_queries_for_few_and_many_processes(staff_client, django_assert_max_num_queries):
    def add_process() -> None:
        now = timezone.now()
        GatewayProcess.objects.create(boot_id=uuid.uuid4(), hostname="gw", pid=1, started_at=now, heartbeat_at=now)

    add_process()
    with django_assert_max_num_queries(20) as few:
        staff_client.get(system_url())
    for _ in range(20):
        add_process()

    with django_assert_max_num_queries(len(few.captured_queries)):
        response = staff_client.get(system_url())

    # A gateway another test of this worker started may have registered its own row too.
    assert len([row for row in response.context["processes"] if row.hostname == "gw"]) == 21
