"""Loaded before Django is set up: settings for the test process itself."""

import os

# The test process opens connections from helper threads (sync_to_async, concurrency tests);
# persistent ones would keep sessions on the test database and block dropping it at the end.
# Gateway processes started by the tests set their own value.
os.environ.setdefault("DB_CONN_MAX_AGE", "0")
