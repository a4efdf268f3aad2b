"""Optimization of a schedule's compute order for bubbles under a cost model and a memory limit.

One strategy a file: ``greedy`` and ``v_greedy`` (the Zero Bubble automatic
schedulers, ZB-1p/2p and ZB-V), ``list_schedule`` (list scheduling for any
one-chain placement), ``local`` (local search), ``exact`` (z3, with a proven
bound); ``evaluate`` is the fast evaluator they share, ``bounds`` the proven
lower bounds, ``units`` the exact integer units they work in, ``placement``
the layouts they may choose, ``search`` the driver that runs them and
verifies the result, ``budget`` how much of the time limit the search may
take (the verification's share kept), and ``result`` what it returns.
"""

from pipeforge.optimizer.result import Metrics, OptimizeResult
from pipeforge.optimizer.search import STRATEGIES, optimize

__all__ = ["Metrics", "OptimizeResult", "STRATEGIES", "optimize"]
