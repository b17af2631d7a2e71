"""One verdict engine for `search` and `analyze`: what holds a job back, decided from
evidence that does not come from the figures it judges.

    from autotune.verdict import RuleInputs, decide
    v = decide(RuleInputs(au=0.4, data_share=0.6, ..., system=figures, storage_ceiling=300))
    v.bottleneck, v.summary, v.evidence, v.next_command, v.advice

`analyze` feeds it a training log's figures and the monitor's samples of that window;
`search` feeds it the recommended configuration's figures and the monitor's samples of
its own window, with the ceilings measured apart from the trials (a ceiling a trial
overtook is a wrong measurement and is not given). The vocabulary: _types.BOTTLENECKS.
"""

from autotune.verdict._types import BOTTLENECKS, Verdict
from autotune.verdict.rules import RuleInputs, decide

__all__ = ["BOTTLENECKS", "RuleInputs", "Verdict", "decide"]
