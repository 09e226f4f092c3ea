"""The admin site's frame: "View site" opens the operators' console, and the read-only tables of gateway processes
and placement histories are listed under their plural names, with nothing to add, change or delete."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse
from django.utils import timezone

from gateway.models import GatewayProcess
from workers_app.models import PlacementHistory

pytestmark = pytest.mark.django_db


def test_view_site_leads_to_the_console(admin_client):
    body = admin_client.get(reverse("admin:index")).content.decode()

    assert f'<a href="{reverse("ui:home")}">View site</a>' in body
    assert reverse("ui:home") == "/ui/"


@pytest.mark.parametrize(
    ("model", "plural"), [(GatewayProcess, "Gateway processes"), (PlacementHistory, "Placement histories")]
)
def test_the_index_lists_the_read_only_tables_by_their_plural_names(admin_client, model, plural):
    changelist = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")

    body = admin_client.get(reverse("admin:index")).content.decode()
    page = admin_client.get(changelist)

    assert f'<a href="{changelist}">{plural}</a>' in body
    assert page.status_code == 200
    assert f"Select {model._meta.verbose_name} to view" in page.content.decode()  # a view-only list
    assert admin_client.get(reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_add")).status_code == 403


def test_a_gateway_process_page_changes_nothing_when_posted(admin_client):
    now = timezone.now()
    process = GatewayProcess.objects.create(
        boot_id=uuid.uuid4(), hostname="gw-admin", pid=7, started_at=now, heartbeat_at=now
    )
    change_url = reverse("admin:gateway_gatewayprocess_change", args=[process.pk])

    response = admin_client.post(change_url, {"hostname": "renamed", "pid": "8"})

    assert response.status_code == 403
    process.refresh_from_db()
    assert (process.hostname, process.pid) == ("gw-admin", 7)
