"""The agent's tools and loop, Django-free: the gateway and the worker child on a node host run the same code.

Standard library only (plus the rest of ``openclaw_client``): the worker child runs it from the worker
bundle. The tools' public interface is :mod:`openclaw_client.agent.tools` (docs/agent-tools.md).
"""
