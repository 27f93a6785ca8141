"""What talks to the service over HTTP: the producer helper a tool server uses
(:mod:`.producer`), the operator client behind ``afterword continuations`` (:mod:`.operator`),
the MCP host helpers (:mod:`.mcp_sessions`) and the host API client (:mod:`.hostapi_client`).

Nothing is imported here: a tool server that imports the producer must not pay for the
MCP SDK or the service's HTTP stack.
"""
