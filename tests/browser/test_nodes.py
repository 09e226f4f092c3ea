"""The nodes page in Debian's Chromium against a real gateway and a real node host: the Decision cell of a pending
request lines up with its column at 1440 px, an approved node reads "approved — waiting for the node to reconnect"
until it connects, and then turns "online" over the page's live socket, without a reload. Screenshots under
``test-artifacts/screenshots/``."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from gateway import scopes as sc
from tests.browser.test_console import PASSWORD
from tests.browser.test_console_flows import NODE_WAIT_S, open_the_node_hosts_request
from tests.support.operators import operator_user
from tests.support.processes import start_node_host

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WIDE = {"width": 1440, "height": 900}
WAITING = "approved — waiting for the node to reconnect"


def box(locator) -> dict:
    found = locator.bounding_box()
    assert found is not None
    return found


def test_an_approved_node_waits_to_reconnect_then_shows_online_live(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, sc.PAIRING, password=PASSWORD)
    node_host = start_node_host(gateway)
    try:
        approve = open_the_node_hosts_request(page, gateway, node_host)

        # The Decision cell is a cell of its column: same left edge and width as its header, same row as its node.
        page.set_viewport_size(WIDE)
        header = box(page.locator(".node-requests thead th").nth(3))
        cell = box(page.locator(".node-requests tbody td.node-decision").first)
        first_cell = box(page.locator(".node-requests tbody td").first)
        assert abs(cell["x"] - header["x"]) <= 1 and abs(cell["width"] - header["width"]) <= 1
        assert abs(cell["y"] - first_cell["y"]) <= 1 and abs(cell["height"] - first_cell["height"]) <= 1
        reject = box(page.get_by_role("button", name="Reject test-node-host"))
        assert abs(box(approve)["y"] - reject["y"]) <= 1  # side by side
        screenshots.take(page, "nodes-pending-request")

        # Stopped, the node cannot connect at the approval: the page says what it waits for.
        node_host.stop()
        approve.click()
        row = page.locator('[data-live-region="nodes"] tr').filter(has_text="test-node-host")
        expect(row).to_contain_text(WAITING)
        screenshots.take(page, "nodes-approved-waiting")

        node_host.start_again()
        node_host.wait_connects(1, timeout=NODE_WAIT_S)
        # No reload: the node's connect is a presence broadcast, after which the page fetches its parts.
        expect(row).to_contain_text("online", timeout=NODE_WAIT_S * 1000)
        expect(row).not_to_contain_text(WAITING)
        screenshots.take(page, "nodes-connected")
    finally:
        node_host.stop()
        node_host.remove_state()
