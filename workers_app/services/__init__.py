"""All writes of workers_app.

* ``placements`` — the placement store: dispatch barrier, transitions, failure, drain, reconcile,
  retirement, turn claims; one compare-and-set and one history row per change.
"""
