"""RoLoRA §5.2 (Fig. 2): the two-layer LoRA network ``f(x) = ReLU(x A B) W_out`` (eq. (12)),
federated over label-skewed clients, trained by FedAvg-LoRA, FFA-LoRA and RoLoRA.

**Data substitution.** The paper uses MNIST (d = 784, 60,000 training images); MNIST cannot be
downloaded here, so :func:`digits_federation` uses the 8 × 8 handwritten digits that scikit-learn
ships (d = 64, 1797 images, 10 classes; pixel values scaled to [0, 1]), split into a stratified
test set and label-skewed clients: 5 clients × 2 labels or 10 clients × 1 label, without overlap,
every client trimmed to the same number of samples so the client axis batches.

**Model** (paper's notation, row vectors): ``A`` (d × r) Gaussian ``N(0, 1/d)``, ``B`` (r × d)
zero, ``W_out`` (d × c) fixed Gaussian ``N(0, 1/d)`` (its law is not stated). In PEFT terms
``lora_A = Aᵀ`` and ``lora_B = Bᵀ``. With ``B = 0`` the hidden layer is exactly 0, and with the
usual ``ReLU'(0) = 0`` no gradient ever reaches ``A`` or ``B``: nothing trains as printed. The
default ``relu_grad_at_zero=1.0`` takes the other subgradient (``ReLU'(0) = 1``), which is what
lets the first step move ``B``; ``0.0`` is PyTorch's convention (and stays at chance).

**Methods** (§5.2 and §6): every round each client runs ``local_epochs`` epochs of minibatch SGD
(batch 64) from the broadcast factors, then the server averages:

* ``"fedavg"`` — FedAvg of LoRA: both factors trained, both averaged (eqs. (1)–(2));
* ``"ffa"`` — FFA-LoRA: ``A`` frozen at its initialization, ``B`` trained and averaged;
* ``"rolora"`` — RoLoRA (Algorithm 1): odd rounds train and average ``B`` (``A`` fixed), even
  rounds train and average ``A`` (``B`` fixed); rounds are communication rounds, as in Fig. 2.

Batched over the client axis (``torch.bmm``); one torch thread; deterministic given ``seed``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..validation import as_generator, check_choice, check_int, check_positive

__all__ = ["DigitsFederation", "digits_federation", "TwoLayerRun", "train", "METHODS"]

METHODS = ("fedavg", "ffa", "rolora")


class DigitsFederation(NamedTuple):
    """Label-skewed federation: ``X`` (K, m, d), ``y`` (K, m), ``X_test`` (n, d), ``y_test`` (n,),
    ``labels`` (K, labels per client)."""

    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    labels: np.ndarray


def digits_federation(n_clients: int, *, test_fraction: float = 0.25, seed) -> DigitsFederation:
    """scikit-learn's digits (a stand-in for MNIST) split by label: ``n_clients`` in {5, 10}
    (client i gets labels ``{2i, 2i+1}`` or ``{i}``); a stratified ``test_fraction`` is held out."""
    from sklearn.datasets import load_digits

    K = check_int(n_clients, "n_clients", minimum=1)
    if 10 % K:
        raise ValueError(f"n_clients must divide the 10 labels (5 or 10 in the paper), got {K}")
    rng = as_generator(seed, "digits-split")
    data = load_digits()
    X, y = data.data / 16.0, data.target
    per = 10 // K
    train_idx, test_idx = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(test_fraction * idx.size))
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    m = min(sum(train_idx[c].size for c in range(i * per, (i + 1) * per)) for i in range(K))
    Xc, yc = [], []
    for i in range(K):
        idx = rng.permutation(np.concatenate(train_idx[i * per:(i + 1) * per]))[:m]
        Xc.append(X[idx])
        yc.append(y[idx])
    te = np.concatenate(test_idx)
    return DigitsFederation(np.stack(Xc), np.stack(yc), X[te], y[te],
                            np.arange(10).reshape(K, per))


class TwoLayerRun(NamedTuple):
    """``accuracy`` (rounds + 1,): test accuracy of the global model after each round (index 0 is
    the initialization); ``A`` (d, r), ``B`` (r, d): the final global factors."""

    accuracy: np.ndarray
    A: np.ndarray
    B: np.ndarray


def _relu(h: torch.Tensor, grad_at_zero: float) -> torch.Tensor:
    if grad_at_zero == 0.0:
        return torch.relu(h)
    return h * (h >= 0).to(h.dtype)       # d/dh = 1 on h >= 0, so ReLU'(0) = 1


def _logits(X, A, B, W_out, grad_at_zero):
    return _relu(X @ A @ B, grad_at_zero) @ W_out


def train(fed: DigitsFederation, method: str, rounds: int, step_size: float, *, rank: int = 16,
          local_epochs: int = 5, batch_size: int = 64, relu_grad_at_zero: float = 1.0,
          seed) -> TwoLayerRun:
    """Run ``method`` for ``rounds`` communication rounds with SGD step ``step_size``.

    ``seed`` draws ``A`` and ``W_out`` (identical for every method given the seed) and the
    minibatch orders.
    """
    check_choice(method, "method", METHODS)
    rounds = check_int(rounds, "rounds", minimum=1)
    lr = check_positive(step_size, "step_size")
    r = check_int(rank, "rank", minimum=1)
    E = check_int(local_epochs, "local_epochs", minimum=1)
    bs = check_int(batch_size, "batch_size", minimum=1)
    if relu_grad_at_zero not in (0.0, 1.0):
        raise ValueError(f"relu_grad_at_zero must be 0.0 or 1.0, got {relu_grad_at_zero!r}")
    torch.set_num_threads(1)
    K, m, d = fed.X.shape
    c = int(fed.y_test.max()) + 1
    init = as_generator(seed, "two-layer-init")
    A0 = torch.from_numpy(init.normal(0.0, 1.0 / np.sqrt(d), size=(d, r)))
    W_out = torch.from_numpy(init.normal(0.0, 1.0 / np.sqrt(d), size=(d, c)))
    B0 = torch.zeros(r, d, dtype=torch.float64)
    order_rng = as_generator(seed, "two-layer-batches")
    X = torch.from_numpy(fed.X)
    y = torch.from_numpy(fed.y).long()
    X_test = torch.from_numpy(fed.X_test)
    y_test = torch.from_numpy(fed.y_test).long()
    rows = torch.arange(K)[:, None]

    def test_acc(A, B):
        with torch.no_grad():
            return float((_logits(X_test, A, B, W_out, relu_grad_at_zero).argmax(1) == y_test).double().mean())

    A, B = A0.clone(), B0.clone()
    acc = [test_acc(A, B)]
    for t in range(1, rounds + 1):
        train_A = method == "fedavg" or (method == "rolora" and t % 2 == 0)
        train_B = method in ("fedavg", "ffa") or (method == "rolora" and t % 2 == 1)
        Ak = A.expand(K, d, r).clone().requires_grad_(train_A)
        Bk = B.expand(K, r, d).clone().requires_grad_(train_B)
        params = [p for p in (Ak, Bk) if p.requires_grad]
        for _ in range(E):
            perm = torch.from_numpy(np.argsort(order_rng.random((K, m)), axis=1))
            for s in range(0, m, bs):
                idx = perm[:, s:s + bs]
                logits = _logits(X[rows, idx], Ak, Bk, W_out, relu_grad_at_zero)   # (K, b, c)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c), y[rows, idx].reshape(-1),
                                                         reduction="sum") / idx.shape[1]
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g in zip(params, grads):
                        p -= lr * g
        with torch.no_grad():          # the server averages the trained factors only
            A = Ak.mean(0).detach() if train_A else A
            B = Bk.mean(0).detach() if train_B else B
        acc.append(test_acc(A, B))
    return TwoLayerRun(np.array(acc), A.numpy().copy(), B.numpy().copy())
