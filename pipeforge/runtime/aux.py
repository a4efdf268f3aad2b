"""The auxiliary-loss channel: a stage returns a scalar loss that its own backward adds.

A stage module may return ``WithAuxLoss(output, aux_loss)``: ``output`` goes on
to the next stage (or to ``loss_fn`` on the last stage) as if returned alone,
and ``aux_loss``, a scalar tensor, is added to what that stage's backward
differentiates (its gradient is one, divided by the microbatch count with the
rest when ``scale_grads``). An MoE layer's load-balancing loss needs no extra
activation this way. In ``eval`` the auxiliary loss is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class WithAuxLoss:
    output: Any
    aux_loss: torch.Tensor


def unwrap(output: Any, where: str) -> tuple[Any, torch.Tensor | None]:
    """``(output, aux loss or None)``; an auxiliary loss that is not a scalar tensor is refused."""
    if not isinstance(output, WithAuxLoss):
        return output, None
    aux = output.aux_loss
    if not isinstance(aux, torch.Tensor) or aux.numel() != 1:
        from pipeforge.runtime.p2p import PipelineError

        raise PipelineError(f"{where}: WithAuxLoss.aux_loss must be a scalar tensor, got "
                            f"{type(aux).__name__}{list(aux.shape) if isinstance(aux, torch.Tensor) else ''}")
    return output.output, aux.reshape(())
