"""Real MCP Tasks servers for the bridge's tests, one module per server, each run as a script
over stdio or loopback streamable HTTP (``--http --port N``) with ``--gates DIR``."""
