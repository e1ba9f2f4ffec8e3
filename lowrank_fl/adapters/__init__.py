"""CLAIR on real LoRA adapters: PEFT directories in and out, exact at LLM scale.

Modules (one job each):

io          read PEFT adapter directories (safetensors numpy API, lazily), check them, write outputs
reduce      the exact joint-subspace reduction of program (7), (8), (9) (proof in its docstring)
tuning      automatic scale-equivariant λ_L, λ_S (§7 scalings, rank-band rule)
aggregate   clair / fedavg / fedavg-factors / ffa / flexlora / robust baselines on one module
updates     the clients' raw updates through their Gram matrices (norms, directions, row-space shares)
detect      the pooled client-level rule (our extension of (8)): robust scores over all modules
detect_updates  the update rule (default): direction, row-space share and size of each update
module_profile  how each update spreads over the modules (a flag of the update rule), and groups spread alike
feature_profile  how each update spreads over the modules' output features (reported, not a flag)
init_reversal  an A factor reversed against the federation's common LoRA initialization (a flag)
noharm      how far a collaborating client moves toward the others (agreement weights)
plan        the refinement decided after every module: target, weights, refit, its summary
decision    summary.json's "detection" block and the CLI's closing sentence
updates_summary  the update rule's evidence per client in that block ("updates")
refinement_sentence  the CLI's sentence on what each collaborating client received
robust      krum / multikrum / median / trimmed-mean / geomed on the whole updates (reduced coords)
stream      safetensors files written tensor by tensor; staged output directories
split       the split layout: the shared part of (9) once, each client's own part, weights a_k
peft_load   load a client's output (either layout) in PEFT (needs the peft extra)
run         every module on joblib or dask; outputs written while solving, summary.json
memory      the same aggregation on in-memory factors (client → module → (A, B, scaling)), no files
synthetic   synthetic PEFT adapter directories under CLAIR's model (tests, benchmarks, examples)
cli         ``lowrank-fl adapters inspect|aggregate``
"""
from .io import AdapterError, AdapterSet, ModuleFactors, load_adapters
from .save import save_adapter
from .reduce import ReducedModule, pair_blocks, reduce_module
from .tuning import Lambdas, auto_lambdas
from .aggregate import CLIENT_RULES, DEFAULT_CLIENT_RULE, METHODS, ModuleOptions, ModuleResult, aggregate_module
from .run import Aggregation, aggregate_adapters, aggregate_to_dir, write_outputs
from .memory import FactorAggregation, aggregate_factors, factors_from_state_dict
from .noharm import DEFAULT_REFINE, REFINE
from .synthetic import write_synthetic_adapters

__all__ = ["AdapterError", "AdapterSet", "ModuleFactors", "load_adapters", "save_adapter",
           "ReducedModule", "reduce_module", "pair_blocks", "Lambdas", "auto_lambdas",
           "METHODS", "CLIENT_RULES", "DEFAULT_CLIENT_RULE", "ModuleOptions", "ModuleResult", "aggregate_module",
           "Aggregation", "aggregate_adapters", "aggregate_to_dir", "write_outputs",
           "FactorAggregation", "aggregate_factors", "factors_from_state_dict", "REFINE", "DEFAULT_REFINE",
           "write_synthetic_adapters"]
