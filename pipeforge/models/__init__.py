"""From the user's model to stage modules: ``split``, materializing owned layers, token-mean losses.

``pipeforge.split(model, stages, owned=None, layers=None, costs=None)`` is
``pipeforge.models.split.split``; its result's ``.modules`` and
``.tied_parameters`` go to a generated module's ``make_pipeline``;
``pipeforge.models.compiled.split_backend`` compiles stage blocks so that their backward
still splits into I and W. This package imports torch (and transformers for Hugging Face
models, when given one); the runtime does not import it.
"""

from __future__ import annotations

from pipeforge.models.losses import TokenMeanLoss
from pipeforge.models.split import Split, split

__all__ = ["Split", "TokenMeanLoss", "split"]
