"""What the tests (and the benchmarks in ``bench/``) share: process launchers, protocol clients, the
mock OpenAI-compatible server, and the JSON API token."""
