"""The agent's Django-free parts: the gateway and the worker child on a node host run the same code.

Standard library only (plus the rest of ``openclaw_client``): the worker child runs it from the worker
bundle. :mod:`openclaw_client.agent.openai_stream` folds OpenAI chat-completions replies, tool calls included.
"""
