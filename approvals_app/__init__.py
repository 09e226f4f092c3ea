"""Exec approvals: the exec policy documents of the gateway and of each node, and the approvals operators
decide (docs/exec-approvals.md). Below sessions_app (whose turns ask), above devices_app (whose nodes have
documents) and the gateway core (methods, events, audit)."""
