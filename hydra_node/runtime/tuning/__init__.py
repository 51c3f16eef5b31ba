"""``hydra-node benchmark tune``: the pure planner (`plan`: grid, early stop, recommendation, ETA) and
the trial driver (`trial`: one candidate's runner child and its figures)."""
