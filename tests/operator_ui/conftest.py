"""Fixtures of the console's tests: a logged-in operator (``operator.write``: sessions, no pairing, approvals or
admin rights)."""

from __future__ import annotations

import pytest

from gateway import scopes as sc
from tests.support.operators import PASSWORD, operator_user

__all__ = ["PASSWORD"]


@pytest.fixture
def operator_client(client):
    client.force_login(operator_user("ops", sc.WRITE))
    return client
