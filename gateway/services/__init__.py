"""All writes of the gateway core, one module per sub-domain.

* ``pairing`` — pairing requests, approval and rejection, paired devices and nodes (remove, rename),
  silent operator pairing.
* ``tokens`` — per-role device tokens: verify, mint, rotate, revoke.
* ``connections`` — gateway processes and the live connections they register.
* ``sweep`` — the periodic clean-up (expired requests, dead processes).

One transaction per service; events and control messages go out only after commit.
"""
