"""Iterative federated methods, batched over the client axis; each returns a ``Trace``.

fedrep            FedRep Algorithm 2 (linear) and its one-round kernel
fedrep_baselines  local-only and FedSGD with personal heads
flute             FLUTE Algorithm 1 (linear); flute_baselines: FedRep as FLUTE's baseline
fedavg            FedAvg with τ local steps, D-GD, fine-tuning (FedAvg-FT paper)
rolora            RoLoRA Alt-min-GD, FFA-LoRA, FedAvg-LoRA (rank one)
lora_aggregation  rank-r LoRA aggregation: FedAvg of factors, RoLoRA, FlexLoRA; interference
"""
from .fedrep import fedrep, fedrep_round
from .fedrep_baselines import fedsgd, local_only
from .flute import flute
from .flute_baselines import fedrep_flute_baseline
from .fedavg import dgd, fedavg, fedavg_round, fine_tune
from .rolora import fedavg_lora, ffa_lora, rolora
from .lora_aggregation import federated_lora_matrix, interference

__all__ = [
    "fedrep", "fedrep_round", "local_only", "fedsgd", "flute", "fedrep_flute_baseline",
    "fedavg", "dgd", "fedavg_round", "fine_tune", "rolora", "ffa_lora", "fedavg_lora",
    "federated_lora_matrix", "interference",
]
