"""Management routes for re-hosting (on the console port, next to ``/api/status``; docs/models.md
"Growing back"):

* ``GET /api/rehost`` – the wanted set with live host counts, our claims and back-offs (the
  ``rehost`` section of ``/api/status``);
* ``POST /api/rehost/min-hosts`` ``{"model": ID, "min_hosts": N}`` – set ``[rehost].min_hosts``
  of ``model`` on the running node (0 … 16; 0: never re-host it): 200 with the new wanted set;
  400 naming the field for a bad body (``admin/body.py``). ``hydra-node models min-hosts MODEL N``
  calls it and writes the value into the node's config file.

The composition root (``hydra_node/node.py``) puts them in the management route table.
"""

from __future__ import annotations

from typing import Any, Protocol

from hydra_node.admin.body import guarded, json_body
from hydra_node.admin.management import Handler
from hydra_node.admin.status_json import to_json
from hydra_node.api.errors import ApiError
from hydra_node.runtime.hosting.rehost_wire import min_hosts_problem
from hydra_node.http.server import Request, Response

__all__ = ["MAX_BODY_BYTES", "RehostAdmin", "rehost_routes"]

#: Longest accepted body (a model id and a number).
MAX_BODY_BYTES = 2048


class RehostAdmin(Protocol):
    """What the routes need of the re-host service (runtime/hosting/rehost.py)."""

    def status(self) -> Any: ...

    def set_min_hosts(self, model: str, n: int) -> None: ...


def rehost_routes(service: RehostAdmin) -> dict[tuple[str, str], Handler]:
    async def show(request: Request) -> Response:
        return Response.json(200, to_json(service.status()))

    async def set_min_hosts(request: Request) -> Response:
        body = json_body(request, required={"model": str, "min_hosts": int}, max_bytes=MAX_BODY_BYTES)
        problem = min_hosts_problem(body["model"], body["min_hosts"])
        if problem is not None:
            return ApiError(400, f"{problem[0]}: {problem[1]}", "invalid_min_hosts", problem[0]).response()
        service.set_min_hosts(body["model"], body["min_hosts"])
        return Response.json(200, to_json(service.status()))

    return guarded({("GET", "/api/rehost"): show, ("POST", "/api/rehost/min-hosts"): set_min_hosts})
