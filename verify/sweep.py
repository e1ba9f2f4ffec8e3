"""Grids × seeds on joblib, cached on disk and resumable.

(Interface; the verifier-infrastructure work completes backends, caching and progress bars.)

``Sweep(backend, n_jobs, cache_dir, scheduler, progress).map(task, grid, seeds, label)`` runs
``task(seed=seeds[i][j], **grid[i])`` for every i, j and returns ``out[i][j]``.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

__all__ = ["Sweep"]


class Sweep:
    def __init__(self, backend: str = "sequential", n_jobs: int = 1, cache_dir=None,
                 scheduler: str | None = None, progress: bool = False):
        self.backend = backend
        self.n_jobs = n_jobs
        self.cache_dir = cache_dir
        self.scheduler = scheduler
        self.progress = progress

    def map(self, task: Callable, grid: Sequence[Mapping], seeds: Sequence[Sequence[int]],
            label: str = "") -> list[list]:
        return [[task(seed=s, **params) for s in row] for params, row in zip(grid, seeds)]
