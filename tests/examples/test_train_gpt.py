"""examples/train_gpt.py runs under torchrun on CPU and trains: the loss falls."""

from __future__ import annotations

import pytest

from pipeforge.cli import main
from tests.examples.torchrun import falling_loss, torchrun

TINY = ["--steps", "4", "--layers", "4", "--width", "16", "--heads", "2", "--seq", "8", "--vocab", "32",
        "--rows", "8", "--microbatches", "4", "--lr", "1e-2", "--timeout", "60"]


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_train_gpt_with_a_module_generated_at_startup():
    # interleaved: each of the 2 ranks holds 2 stages (stages_of_rank), rank 1 the last
    result = torchrun("train_gpt.py", *TINY, "--schedule", "interleaved-1f1b")
    falling_loss(result)
    assert "rank 1 (stages [1, 3]): step 3 loss" in result.stdout


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_train_gpt_with_a_codegen_module(tmp_path):
    module = tmp_path / "gpipe_2.py"
    assert main(["codegen", "gpipe", "-D", "P=2", "-D", "M=4", "-o", str(module)]) == 0
    result = torchrun("train_gpt.py", *TINY, "--module", str(module))
    falling_loss(result)
    assert "rank 1 (stages [1]): step 0 loss" in result.stdout
