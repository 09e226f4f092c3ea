"""The agent's Django-free parts, shipped in the worker bundle."""
