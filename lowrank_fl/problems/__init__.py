"""Synthetic federated instances with ground truth (one module per model, not per paper).

multitask           linear multi-task representation model y = <B* w_i*, x> + noise (FedRep, FedAvg-FT)
underparameterized  Φ = U Λ V with a spectral gap at k (FLUTE)
lora                rank-one LoRA toy and rank-r matrix LoRA targets (RoLoRA)
fedavg_ft           FedAvg-FT's experimental instance and Proposition 1's instance
(CLAIR's instances live in ``lowrank_fl.clair.simulate``.)
"""
from .multitask import MultitaskProblem, haar_orthonormal, multitask_linear
from .underparameterized import UnderparameterizedProblem, underparameterized
from .lora import LoRAMatrixProblem, RankOneLoRAProblem, lora_matrix_problem, rank_one_lora
from .fedavg_ft import paper_instance, proposition1_instance, new_client

__all__ = [
    "multitask_linear", "MultitaskProblem", "haar_orthonormal",
    "underparameterized", "UnderparameterizedProblem",
    "rank_one_lora", "RankOneLoRAProblem", "lora_matrix_problem", "LoRAMatrixProblem",
    "paper_instance", "proposition1_instance", "new_client",
]
