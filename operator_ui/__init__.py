"""The operators' web console: server-rendered pages over the same services as the RPC and the API."""
