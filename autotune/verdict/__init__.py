"""One verdict engine for `search` and `analyze`: what holds a job back, decided from
evidence that does not come from the figures it judges.

    from autotune.verdict import RuleInputs, decide
    v = decide(RuleInputs(au=0.4, data_share=0.6, ..., system=figures, storage_ceiling=300))
    v.bottleneck, v.summary, v.evidence, v.next_command, v.advice
    worker_bound(usable_cores=8, blocked_share=0.75)      # the most DataLoader workers
    latency_verdict(needed_in_flight=32, bound=8)         # loader (latency) or storage (latency)

The verdict is decided from the time budget (SystemFigures.budget: where each loading
process's time went) by a family of rules (rules/: one module per rule, read in the order
of rules.RULES; _base.py: what a rule is); storage/ is the family that classes the storage
under a dataset for `autotune probe`; bounds.py holds the worker bound and the latency rule for every
module that needs them. `analyze` feeds it a training log's figures and the monitor's samples of that window;
`search` feeds it the recommended configuration's figures and the monitor's samples of
its own window, with the ceilings measured apart from the trials (a ceiling a trial
overtook is a wrong measurement and is not given). The vocabulary: _types.BOTTLENECKS.
"""

from autotune.verdict._types import BOTTLENECKS, Verdict
from autotune.verdict.bounds import LatencyCall, latency_verdict, worker_bound
from autotune.verdict.rules import RuleInputs, budget_of, decide

__all__ = ["BOTTLENECKS", "LatencyCall", "RuleInputs", "Verdict", "budget_of", "decide",
           "latency_verdict", "worker_bound"]
