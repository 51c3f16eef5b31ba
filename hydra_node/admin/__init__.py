"""The management port (:3131): ``/api/*`` routes, ``/metrics``, the event stream and the web console.

:mod:`.management` (``ManagementApi``: the port's router and ``/api/status``), route tables
:mod:`.invites`, :mod:`.runtime` (hot swap), :mod:`.models`, :mod:`.placement`, :mod:`.kv`;
:mod:`.metrics` (Prometheus), :mod:`.events` (``/api/events`` SSE), :mod:`.history` (load time
series), :mod:`.assets` (the console's static files in ``console/``), :mod:`.status_json` (typed
status objects -> JSON). docs/api.md, docs/console.md.
"""
