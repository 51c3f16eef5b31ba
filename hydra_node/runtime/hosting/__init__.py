"""What this node hosts: the `ModelRuntime` service (`service`), one hosted model's life
(`hosted_model`: place, load, split over RPC workers and heal a split that lost one, hot swap),
the pure layer placement rule (`layers.place`), the host's memory (`meminfo`), and growing back
(docs/models.md "Growing back"): the announced re-host keys (`rehost_wire`), the pure election
(`rehost_plan`) and the service that hosts a model the mesh lost (`rehost`)."""
