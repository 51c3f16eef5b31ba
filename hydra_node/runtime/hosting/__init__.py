"""What this node hosts: the `ModelRuntime` service (`service`), one hosted model's life
(`hosted_model`: place, load, split over RPC workers, hot swap) and the pure placement rule
(`placement.place`)."""
