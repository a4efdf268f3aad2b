"""A warning when an optimizer lists one of a pipeline's parameters twice (it would update it twice a step).

Building the optimizer from the stage modules (``[p for m in stage_modules.values()
for p in m.parameters()]``) lists a parameter two stage modules of a rank share
(a tied embedding and LM head on a V schedule) twice: it is then updated twice
per step, silently. ``pipe.parameters()`` lists each once. ``watch(pipeline)``
registers one optimizer step pre-hook (torch's global registry) for as long as
the pipeline lives; at the first ``step()`` of each optimizer it looks for the
pipeline's parameters listed more than once and warns, naming them.
"""

from __future__ import annotations

import warnings
import weakref
from collections import Counter

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


class PipelineWarning(UserWarning):
    """Something a pipeline's user did that trains, but not as they meant."""


def duplicates(pipeline, optimizer: torch.optim.Optimizer) -> list[str]:
    """The pipeline's parameters that ``optimizer`` lists more than once, described by stage and name."""
    counts = Counter(id(p) for group in optimizer.param_groups for p in group["params"])
    names: dict[int, list[str]] = {}
    for stage, module in sorted(pipeline.stage_modules().items()):
        for name, param in module.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(f"stage {stage} {name!r}")
    return [f"{' = '.join(names[key])} ({counts[key]} times)" for key in names if counts.get(key, 0) > 1]


def warn_duplicates(pipeline, optimizer: torch.optim.Optimizer) -> None:
    found = duplicates(pipeline, optimizer)
    if found:
        warnings.warn(f"rank {pipeline.rank}: the optimizer lists parameter {found[0]}"
                      + (f" and {len(found) - 1} more" if len(found) > 1 else "")
                      + ": it is updated that many times per step; build the optimizer from pipe.parameters(), "
                      "which lists each parameter of this rank once", PipelineWarning, stacklevel=4)


def watch(pipeline) -> None:
    """Check every optimizer once, at its first step, while ``pipeline`` is alive."""
    pipeline_ref = weakref.ref(pipeline)
    checked: weakref.WeakSet = weakref.WeakSet()

    def hook(optimizer, args, kwargs):
        found = pipeline_ref()
        if found is None or optimizer in checked:
            return
        checked.add(optimizer)
        warn_duplicates(found, optimizer)
        return

    handle = register_optimizer_step_pre_hook(hook)
    weakref.finalize(pipeline, handle.remove)
