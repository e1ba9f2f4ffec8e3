"""Your own local estimates: an ``.npz`` holding ``W_hat`` of shape (K, q, p).

    benchopt run benchmarks/benchopt_clair -d "npz[path=/abs/path/W_hat.npz]"

Without a path (the default) the objective skips this dataset.
"""
from pathlib import Path

import numpy as np
from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "npz"
    parameters = {"path": [""]}

    def get_data(self):
        if not self.path:
            return dict(W_hat=None)
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"npz dataset: file not found: {path}")
        with np.load(path, allow_pickle=False) as data:
            if "W_hat" not in data.files:
                raise KeyError(f"{path} has no array named 'W_hat' (shape (K, q, p)); keys "
                               f"found: {sorted(data.files)}")
            return dict(W_hat=np.array(data["W_hat"]))
