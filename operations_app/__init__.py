"""Operations: what an operator watches a running gateway with — metrics, logs, usage, health and the system
view (docs/operations.md). Above every domain app (it reads their state to report it), below the console."""
