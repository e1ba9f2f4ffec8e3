"""The CLAIR paper's §7 simulation (``lowrank_fl.clair.simulate``): K clients, q x p local
estimates from n samples each, rank-2 shared structure, 40% contaminated clients."""
from benchopt import BaseDataset

from lowrank_fl.clair import simulate


class Dataset(BaseDataset):
    name = "clair-simulation"
    parameters = {"K": [10, 20], "p": [10], "q": [10], "n": [100]}
    test_parameters = {"K": [4], "p": [4], "q": [4], "n": [50]}

    def get_data(self):
        inst = simulate(p=self.p, q=self.q, n_clients=self.K, samples_per_client=self.n,
                        seed=self.get_seed(use_repetition=True))
        return dict(W_hat=inst.W_hat)
