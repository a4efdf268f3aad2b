"""The zoo's GPT with dropout on (``gpt-dropout``), as a ``pipeforge profile`` model file (docs/profile.md).

One ``nn.TransformerEncoderLayer`` block a stage (dropout 0.3), the embedding on stage 0, the head on the
last; float64; ``ROWS`` sequences a step (``ROWS // 8`` a microbatch at 8 microbatches). Used by
``tests/runtime/test_runtime_saved_peak.py`` and ``benchmarks/runtime/memory.py``.
"""

from __future__ import annotations

from tests.zoo import models as zoo

ROWS = 16


def pipeforge_model(stages: int) -> dict:
    modules = zoo.build("gpt-dropout", stages, seed=0)
    tokens, targets, _ = zoo.batch("gpt-dropout", ROWS, 0)
    return {"modules": modules, "batch": tokens, "target": targets, "loss_fn": zoo.loss_fn}
