"""The gateway token the JSON API accepts in the apps' tests (see the ``api_token`` fixture)."""

API_TOKEN = "api-test-token"
