"""The HTTP/1.1 transport (h11 over trio), with no knowledge of any API.

:mod:`.server` (``HttpServer``: listeners, connection admission, drain on shutdown),
:mod:`.connection` (one connection: read, screen, answer, keep-alive), :mod:`.guard` (the pure
front-door decisions: Host, Origin, CORS, the bearer check), :mod:`.limits` (connection-level
bounds as pure policy), :mod:`.messages` (``Request``, ``Response``, ``StreamResponse``).
Applications are plain ``async handler(Request) -> Response | StreamResponse`` callables.
"""
