"""`autotune search`: the best DataLoader settings for a dataset, why, and how far they
are from what the machine could ever give.

    from autotune.search import SearchOptions, run_search
    res = run_search("/data/train", SearchOptions(preset="resnet50", trials=20))
    res.recommended.params, res.verdict.bottleneck, res.to_dict()

Modules: `space` (the YAML search space), `ceilings` (storage, decode, demand), `recommend`
(recommendation, baseline, snippets), `verdict` (the bottleneck), `study` (the Optuna
ask-and-tell loop), `records` (one trial).
"""

from autotune.search.ceilings import Ceilings
from autotune.search.recommend import baseline_params, knee
from autotune.search.records import TrialRecord
from autotune.search.space import SearchSpace, load_space
from autotune.search.result import SearchResult
from autotune.search.study import SearchOptions, run_search
from autotune.search.verdict import decide
from autotune.verdict import Verdict

__all__ = ["Ceilings", "SearchOptions", "SearchResult", "SearchSpace", "TrialRecord", "Verdict",
           "baseline_params", "decide", "knee", "load_space", "run_search"]
