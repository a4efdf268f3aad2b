"""What generated pipeline modules import: the rank context, the Pipeline, transport and microbatches.

A generated module calls ``build_pipeline`` from its ``make_pipeline``; its rank
functions call the methods of ``RankContext``.
"""

from pipeforge.runtime.context import Comm, RankContext, ScheduleInfo
from pipeforge.runtime.p2p import PipelineError
from pipeforge.runtime.pipeline import Pipeline, build_pipeline

__all__ = ["Comm", "Pipeline", "PipelineError", "RankContext", "ScheduleInfo", "build_pipeline"]
