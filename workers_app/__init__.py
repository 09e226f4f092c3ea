"""Workers: where a session's turns run when they do not run on the gateway.

This app will own session placements (local → requested → … → active → draining → reconciling),
worker environments and the worker providers behind them (``device``, ``static-ssh``, ``local``),
their recovery, and paired nodes as worker hosts. It builds on ``sessions_app`` and never the
other way round: it plugs in through the seams of :mod:`sessions_app.extensions`, filled from
:meth:`WorkersConfig.ready`:

* ``turn_runners.add_selector`` — a turn of a session whose placement is ``active`` on a worker
  runs on that worker instead of the gateway;
* ``session_projections.register("placement", …)`` — the placement projection in
  ``sessions.describe`` / ``sessions.list``, the JSON API and the operator views;
* ``action_guards.register`` — local admission closes while a placement is mid-dispatch or moving.
"""
