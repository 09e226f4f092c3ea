"""All writes of the gateway core, one module per sub-domain.

* ``connections`` — gateway processes and the records of the connections they hold.
* ``sweep`` — the periodic clean-up (dead processes).

Devices, pairing and device tokens, and what a connection's coming and going records on its device,
are ``devices_app``'s. One transaction per service; events and control messages go out only after commit.
"""
