"""Workers: where a session's turns run when they do not run on the gateway.

This app owns session placements (local → requested → … → active → draining → reconciling), worker
environments and the worker providers behind them (``device``, ``static-ssh``, ``local``), their
recovery, and paired nodes as worker hosts (``nodes/``). It builds on ``sessions_app`` and
``devices_app`` and never the other way round: it provides their ports once, from
:meth:`WorkersConfig.ready` (``workers_app/ports.py``):

* ``sessions_app.ports.provide_placements`` — a turn of a session whose placement is ``active`` on a
  worker runs there; the ``placement`` field of session rows; local admission closes while a placement
  is mid-dispatch or moving (the dispatch barrier);
* ``devices_app.ports.provide_node_workers`` — the worker fields of node rows, and the cleanup of a
  removed node's environments and placements.
"""
