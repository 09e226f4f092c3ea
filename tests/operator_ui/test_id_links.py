"""Shortened ids (12 characters, the whole id in the tooltip and a copy button) and the links between the pages:
session ↔ placement ↔ environment ↔ node."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from devices_app.services import pairing
from gateway.audit import Actor
from sessions_app.services import runs
from tests.operator_ui.test_nodes import pending_request
from tests.operator_ui.test_tool_transcript import running_turn
from tests.operator_ui.test_views import make, session_url, text_of
from tests.workers_app.test_inference_proxy import ENVIRONMENT, placed_session
from workers_app.models import WorkerEnvironment

pytestmark = pytest.mark.django_db

NODE_ID = "c3" * 32


@pytest.fixture
def placed_on_a_paired_node():
    request = pending_request(NODE_ID)
    pairing.pairing_request_approve(request_id=str(request.request_id), actor=Actor.system(), role="node")
    return placed_session(NODE_ID, key="agent:main:on-node")


def short_id_html(full: str, link: str = "") -> str:
    code = f'<code title="{html.escape(full)}">{html.escape(full[:12])}…</code>'
    return f'<a href="{html.escape(link)}">{code}</a>' if link else code


def test_the_session_page_s_placement_card_links_its_environment_and_node(operator_client, placed_on_a_paired_node):
    page = text_of(operator_client.get(session_url(placed_on_a_paired_node)))

    assert short_id_html(ENVIRONMENT, f"/ui/environments/#env-{ENVIRONMENT}") in page
    assert short_id_html(NODE_ID, f"/ui/nodes/#node-{NODE_ID}") in page
    assert f'data-copy="{NODE_ID}"' in page


def test_the_environments_page_anchors_each_environment_and_links_its_node_and_sessions(
    operator_client, placed_on_a_paired_node
):
    WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(shared_host=False)
    WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(
        attached_session_ids=[placed_on_a_paired_node.session_id, "gone-session-id-0123456789"]
    )

    page = text_of(operator_client.get(reverse("ui:environments")))

    assert f'<tr id="env-{ENVIRONMENT}">' in page
    assert short_id_html(ENVIRONMENT) in page
    assert short_id_html(NODE_ID, f"/ui/nodes/#node-{NODE_ID}") in page
    assert f'href="{session_url(placed_on_a_paired_node)}"' in page
    assert short_id_html("gone-session-id-0123456789") in page  # a session that is gone stays a bare id


def test_the_nodes_page_anchors_each_node_and_links_its_environments_and_sessions(
    operator_client, placed_on_a_paired_node
):
    page = text_of(operator_client.get(reverse("ui:nodes")))

    assert f'<tr id="node-{NODE_ID}">' in page
    assert short_id_html(NODE_ID) in page
    assert short_id_html(ENVIRONMENT, f"/ui/environments/#env-{ENVIRONMENT}") in page
    assert f'href="{session_url(placed_on_a_paired_node)}"' in page


def test_a_torn_down_environment_is_no_longer_listed_under_its_node(operator_client, placed_on_a_paired_node):
    WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(state="destroyed")

    page = text_of(operator_client.get(reverse("ui:nodes")))

    assert f'<tr id="node-{NODE_ID}">' in page and f"#env-{ENVIRONMENT}" not in page


def test_the_nodes_page_reads_the_hosted_environments_in_a_bounded_number_of_queries(
    operator_client, placed_on_a_paired_node, django_assert_max_num_queries
):
    with django_assert_max_num_queries(12) as one:
        operator_client.get(reverse("ui:nodes"))
    for index in range(5):
        WorkerEnvironment.objects.create(
            environment_id=f"worker:extra-{index}",
            provider_id="device",
            profile_id=f"device:{NODE_ID}",
            state="attached",
            lease_id=f"device:{NODE_ID}:extra-{index}",
            node_device_id=NODE_ID,
            owner_epoch=1,
            attached_session_ids=[make(f"agent:main:extra{index}").session_id],
            created_at_ms=2,
            updated_at_ms=2,
            state_changed_at_ms=2,
        )
    with django_assert_max_num_queries(len(one.captured_queries)):
        page = text_of(operator_client.get(reverse("ui:nodes")))

    assert page.count('class="muted hosted"') == 6


def test_the_runs_and_sessions_pages_shorten_their_ids(operator_client):
    session = make("agent:main:ids")
    run_id = running_turn(session, "a-run-id-longer-than-twelve")

    runs_page = text_of(operator_client.get(reverse("ui:runs")))
    sessions_page = text_of(operator_client.get(reverse("ui:sessions")))

    assert short_id_html(run_id) in runs_page and f'data-copy="{run_id}"' in runs_page
    assert short_id_html(session.session_id) in sessions_page
    assert re.search(rf'aria-label="Copy the whole id {session.session_id}" hidden>Copy</button>', sessions_page)


def test_hostile_ids_are_escaped_in_anchors_tooltips_and_copy_buttons(operator_client):
    session = make("agent:main:hostile")
    hostile = 'run"><script>alert(1)</script>'
    runs.run_submit(session_key=session.key, message="x", idempotency_key=hostile)

    page = text_of(operator_client.get(reverse("ui:runs")))

    assert "<script>alert(1)</script>" not in page
    assert f'data-copy="{html.escape(hostile)}"' in page
