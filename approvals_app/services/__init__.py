"""All writes of approvals_app, one module per sub-domain.

* ``policies`` — exec policy documents: ``exec_policy_set`` (compare-and-set), allow-always entries.
* ``approvals`` — ``exec_approval_request``, ``exec_approval_resolve``, expiry, cancellation.
* ``waiting`` — ``exec_approval_wait``: a synchronous caller (a turn) waits for the decision.

One transaction per service, as small as the read-modify-write it protects; events and wake-ups go out
only after commit.
"""

from .approvals import (
    exec_approval_cancel,
    exec_approval_expire,
    exec_approval_request,
    exec_approval_resolve,
    exec_approvals_cancel_for_run,
    exec_approvals_expire_due,
)
from .policies import exec_policy_set
from .waiting import exec_approval_wait

__all__ = [
    "exec_approval_cancel",
    "exec_approval_expire",
    "exec_approval_request",
    "exec_approval_resolve",
    "exec_approval_wait",
    "exec_approvals_cancel_for_run",
    "exec_approvals_expire_due",
    "exec_policy_set",
]
