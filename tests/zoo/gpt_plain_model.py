"""The zoo's GPT without dropout (``gpt``), as a ``pipeforge profile`` model file (docs/profile.md).

One ``nn.TransformerEncoderLayer`` block a stage, the embedding on stage 0, the head on the last; float64;
``gpt_model.ROWS`` sequences a step. Its stages hold more from I to W than their activation (1.36-1.40 of
it: the gradients I leaves for W). Used by ``tests/runtime/test_runtime_saved_peak.py``.
"""

from __future__ import annotations

from tests.zoo import models as zoo
from tests.zoo.gpt_model import ROWS


def pipeforge_model(stages: int) -> dict:
    modules = zoo.build("gpt", stages, seed=0)
    tokens, targets, _ = zoo.batch("gpt", ROWS, 0)
    return {"modules": modules, "batch": tokens, "target": targets, "loss_fn": zoo.loss_fn}
