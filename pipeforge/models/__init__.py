"""From the user's model to stage modules: ``split``, materializing owned layers, token-mean losses.

``pipeforge.split(model, stages, owned=None, layers=None, costs=None)`` is
``pipeforge.models.split.split``; its result's ``.modules`` and
``.tied_parameters`` go to a generated module's ``make_pipeline``. This package
imports torch (and transformers for Hugging Face models, when given one); the
runtime does not import it.
"""

from __future__ import annotations

from pipeforge.models.losses import TokenMeanLoss
from pipeforge.models.split import Split, split

__all__ = ["Split", "TokenMeanLoss", "split"]
