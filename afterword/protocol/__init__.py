"""The HTTP protocol shared by the server and its clients: wire bodies (:mod:`.wire`), the
views that turn records into bodies (:mod:`.views`) and every URL path (:mod:`.paths`).

Nothing is imported here, so a client that needs only the wire bodies does not load the
views' domain imports. See "docs/design.md, Contracts: HTTP".
"""
