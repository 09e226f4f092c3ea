"""Workers on nodes: what the gateway says to a node host and what it keeps of what nodes declare.

* ``inventory`` — ``node.runnerInventory.update``: the worker-host declaration a node sends, checked.
* ``hosts`` — those declarations recorded per connection (writes), read by node rows and dispatch.
* ``calls`` — calling a node's private worker commands from synchronous code.
* ``runtime`` — the node host as the worker runtime: install, workspace sync, start, stop.
* ``ssh`` — a static-ssh host made a node (the node host installed over SSH and enrolled).
* ``retention`` — after every (re)connect: which workspaces and bundles the node still needs.
* ``turn_lookups`` — the two reads on every node-placed turn's path.
"""
