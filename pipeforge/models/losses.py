"""Losses right by construction over microbatches: the token mean of a padded batch.

``TokenMeanLoss(ignore_index=-100)`` sums each microbatch's token losses and divides by the valid tokens
of the whole batch (``loss_fn.batch(target, count=...)`` on the rank holding the last stage; ``count``
over every replica's batch with data parallelism), so the microbatches' losses add up to the batch's
token mean and their gradients to its gradient. Use it with ``make_pipeline(..., scale_grads=False)``:
the division is done already. An auxiliary loss a stage returns (``runtime.aux.WithAuxLoss``) is added
once per microbatch. Usage: ``docs/models.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TokenMeanLoss:
    """``loss_fn(logits, target)``: the sum of the microbatch's token losses over the batch's valid tokens."""

    def __init__(self, ignore_index: int = -100):
        self.ignore_index = ignore_index
        self.count: torch.Tensor | None = None

    def batch(self, target: torch.Tensor, count: int | torch.Tensor | None = None) -> torch.Tensor:
        """Record the batch's valid-token count (or the given one); returns ``target`` for ``step(target=...)``."""
        self.count = (target != self.ignore_index).sum() if count is None else torch.as_tensor(count)
        return target

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.count is None:
            raise ValueError("TokenMeanLoss: call loss_fn.batch(target) with the whole batch's target before step()")
        total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                ignore_index=self.ignore_index, reduction="sum")
        return total / self.count.clamp(min=1).to(total.dtype)
