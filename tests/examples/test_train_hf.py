"""examples/train_hf.py runs under torchrun on CPU: a Hugging Face model split, checked and trained; the loss falls."""

from __future__ import annotations

import pytest

from tests.examples.torchrun import falling_loss, torchrun


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule, family, last_rank", [("1f1b", "llama", 1), ("zbv", "mixtral", 0)])
def test_train_hf_trains(schedule, family, last_rank):
    result = torchrun("train_hf.py", "--steps", "4", "--timeout", "60", "--schedule", schedule, "--family", family)
    falling_loss(result, last_rank)
