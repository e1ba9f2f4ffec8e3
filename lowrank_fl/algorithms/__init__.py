"""lowrank_fl.algorithms (public names are re-exported here)."""
