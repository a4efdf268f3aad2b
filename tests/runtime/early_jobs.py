"""The worker of ``test_runtime_early_receives``: one pipeline posting receives early, one posting them where
the program does, the same float64 stages in both, several steps and an eval."""

from __future__ import annotations

import copy

import torch

from pipeforge.tools.generated import load_module

WIDTH = 3


def stages(count: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double() for _ in range(count)]


def run(rank: int, nproc: int, module_paths: list[str]) -> list[dict]:
    return [run_one(rank, path) for path in module_paths]


def run_one(rank: int, path: str) -> dict:
    generated = load_module(path)
    info = generated.SCHEDULE
    full = stages(info.stages)
    early = {s: full[s] for s in generated.stages_of_rank(rank)}
    late = copy.deepcopy(early)
    mse = torch.nn.functional.mse_loss
    pipes = {"early": generated.make_pipeline(early, loss_fn=mse), "late": generated.make_pipeline(late, loss_fn=mse)}
    pipes["late"].post_early = False
    batch = torch.randn(4 * info.microbatches, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    target = torch.randn(batch.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    args = (batch,) if pipes["early"].holds_first else ()
    label = target if pipes["early"].holds_last else None
    report = {"diff": 0.0, "early_posts": [], "receives": []}
    for _ in range(3):
        for name, pipe in pipes.items():
            pipe.trace = name == "early"
            pipe.step(*args, target=label)
        events = pipes["early"].last_trace.events
        computes = [e.start for e in events if e.kind in ("F", "B")]
        first_post = next((e for e in events if e.kind == "post"), None)
        early_post = first_post is not None and computes and first_post.end <= min(computes)
        report["early_posts"].append(first_post.label if early_post else "")
        report["receives"].append(sorted(token for e in events if e.kind == "post" for token in e.label.split()
                                         if "RECV" in token))
        for a, b in zip(early.values(), late.values()):
            for pa, pb in zip(a.parameters(), b.parameters()):
                report["diff"] = max(report["diff"], (pa.grad - pb.grad).abs().max().item())
        for module in (*early.values(), *late.values()):
            module.zero_grad(set_to_none=True)
    outputs = [pipe.eval(*args, target=label) for pipe in pipes.values()]
    if outputs[0] is not None:
        report["diff"] = max(report["diff"], (outputs[0] - outputs[1]).abs().max().item())
    return report
