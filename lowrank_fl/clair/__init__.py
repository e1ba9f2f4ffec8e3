"""lowrank_fl.clair (public names are re-exported here)."""
