"""All writes of sessions_app, one module per sub-domain.

* ``sessions`` — session rows: create, patch, reset, delete; :func:`sessions.session_lock`.
* ``rows`` — how any service writes a session row: the revision's compare-and-set, the stale-write refusal.
* ``creation`` — ``sessions.create`` as callers ask for it (workspace, session, first turn).
* ``workspace`` — managed git worktrees.
* ``runs`` — chat runs: submit, claim, finish, abort, recovery, and turn dispatch.
* ``transcripts`` — transcript appends (one, or many at once).
* ``initialization`` — multi-store initialization of a session, readiness and guarded rollback.
* ``forks`` — ``sessions.fork`` (local and upstream-linked) and ``sessions.adopt``.
* ``links`` — upstream links to external runtime threads.

One transaction per service, as small as the read-modify-write it protects; events and task
dispatch happen only after commit.
"""
