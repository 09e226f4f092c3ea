"""The agent, Django-free: the gateway and the worker child on a node host run the same code.

Standard library only (plus the rest of ``openclaw_client``): the worker child runs it from the worker
bundle. :mod:`~openclaw_client.agent.loop` is the agent loop, :mod:`~openclaw_client.agent.tools` the tools'
public interface, :mod:`~openclaw_client.agent.openai_stream` folds OpenAI chat-completions replies (tool calls
included), :mod:`~openclaw_client.agent.exec_policy` decides on commands (docs/agent-tools.md,
docs/exec-approvals.md).
"""
