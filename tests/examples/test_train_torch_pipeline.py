"""examples/train_torch_pipeline.py runs under torchrun on CPU: torch's pipeline() split of GPT-2 trains; loss falls."""

from __future__ import annotations

import pytest

from tests.examples.torchrun import falling_loss, torchrun


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule, last_rank", [("1f1b", 1), ("zbv", 0)])
def test_train_torch_pipeline_trains(schedule, last_rank):
    result = torchrun("train_torch_pipeline.py", "--steps", "4", "--timeout", "60", "--schedule", schedule)
    falling_loss(result, last_rank)
