"""lowrank_fl.problems (public names are re-exported here)."""
