"""lowrank_fl.exact (public names are re-exported here)."""
