"""The mixture of agents behind ``model: "mesh"`` (experimental; docs/moa.md).

:mod:`.mixture` (``MixtureOfAgents``: members, asking them, the reducer), :mod:`.arbiter` (pure:
member answers in, one verdict out), :mod:`.config` (``[moa]``), :mod:`.answers` (``MoaApi``: what
every dialect asks of it). Below the dialects: each renders the answers in its own shapes.
"""

from hydra_node.moa.answers import MoaApi
from hydra_node.moa.mixture import MixtureOfAgents

__all__ = ["MixtureOfAgents", "MoaApi"]
