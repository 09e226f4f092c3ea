"""OpenClaw's node-worker dialect (``../shared/spec/reference/node-worker-dialect.md``): how this gateway runs
sessions on OpenClaw's own node host, unmodified, beside the project's node host and its dialect."""
