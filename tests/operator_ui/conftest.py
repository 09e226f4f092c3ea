"""Fixtures of the console's tests: a logged-in operator (a plain Django user, no admin rights)."""

from __future__ import annotations

import pytest

PASSWORD = "a-long-enough-password"


@pytest.fixture
def operator_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_user(username="ops", password=PASSWORD))
    return client
