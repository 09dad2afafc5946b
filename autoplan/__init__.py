"""autoplan: an auto-parallel planner and training-config search for large neural networks.

The planner (specs, profiles, plans, cost model, search) imports no torch; only
`autoplan.runtime` and `autoplan.profiler` do.
"""

__version__ = "0.1.0"
