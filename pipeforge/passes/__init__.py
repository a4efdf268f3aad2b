"""Passes over the IR: pure functions, a schedule in and a new schedule out (one pass a file).

- ``lower``: insert send/receive groups and REDUCE_GRAD;
- ``unshard(s, max_active_stages)``: UNSHARD/RESHARD for FSDP;
- ``reduce_grad``: REDUCE_GRAD after each stage's last backward on each rank;
- ``merge_bw``: an I directly followed by its W becomes a B;
- ``defer_recv``: each receive posted just before the compute that needs it;
- ``PASSES``, ``PassPipeline``: each pass as a named object, applied in torch's order with a callback
  after each; ``apply_passes``: the passes a command line asks for.
"""

from pipeforge.passes.defer_recv import defer_recv
from pipeforge.passes.lower import lower, lower_with_origins
from pipeforge.passes.merge_bw import merge_bw
from pipeforge.passes.pipeline import PASSES, PassOptions, PassPipeline, SchedulePass, apply_passes
from pipeforge.passes.reduce_grad import reduce_grad
from pipeforge.passes.unshard import unshard

__all__ = ["lower", "lower_with_origins", "unshard", "reduce_grad", "merge_bw", "defer_recv",
           "PASSES", "PassOptions", "PassPipeline", "SchedulePass", "apply_passes"]
