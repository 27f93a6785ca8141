"""The application: repository, claims, runs (host binding), operator verbs, maintenance,
the service facade that composes them, and ``open_service`` (docs/design.md, Layers).

Nothing is imported here eagerly: a client that needs only the binding must not pay for the
service's imports.
"""
