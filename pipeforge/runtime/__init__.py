"""What generated pipeline modules import: the rank context, the Pipeline, transport and microbatches.

A generated module calls ``build_pipeline`` from its ``make_pipeline``; its rank
functions call the methods of ``RankContext``. Nothing else lives here (the tools
around the runtime are ``pipeforge.tools``). The names load lazily, so importing
this package alone imports no torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Comm": "pipeforge.runtime.context",
    "RankContext": "pipeforge.runtime.context",
    "ScheduleInfo": "pipeforge.runtime.context",
    "PipelineError": "pipeforge.runtime.p2p",
    "PipelineUsageError": "pipeforge.runtime.p2p",
    "Pipeline": "pipeforge.runtime.pipeline",
    "build_pipeline": "pipeforge.runtime.pipeline",
    "RankModules": "pipeforge.runtime.rank_modules",
    "microbatch_rng": "pipeforge.runtime.rng",
    "microbatch_seed": "pipeforge.runtime.rng",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeforge.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
