"""Which semantics does a real process group follow: rendezvous, nccl or buffered?

Runs the two-rank cases where pipeforge's three semantics disagree (the same as
``SEMANTICS_CASES`` in tests/verify/test_oracle_agreement.py) on real processes:
each group step is one ``batch_isend_irecv`` whose works are all waited for, each
compute step a small tensor operation. A case that does not finish within
``--timeout`` seconds hung. Each case runs in two phases:

- first step: a fresh process group, the case is the first communication;
- steady state: every connection is made first (a send and a receive in both
  directions, and the case's own traffic once, when it completes), then the case.

and with two message sizes (small messages may be sent eagerly, large ones need
the receiver). It prints, per phase and size, what happened and which models
predicted every outcome. NCCL needs one GPU per rank:

    python scripts/nccl_semantics_check.py --backend nccl     # a machine with 2+ GPUs
    python scripts/nccl_semantics_check.py --backend gloo     # CPUs only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEMANTICS = ("rendezvous", "nccl", "buffered")
CASES = {
    "group meets two groups of the peer": (1, [["0F0", "[0SEND_F0 0RECV_B0]", "0B0"],
                                               ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]),
    "both ranks send before they receive": (2, [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0",
                                                 "0RECV_B1", "0B1"],
                                                ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1",
                                                 "1SEND_B1"]]),
    "two sends in one group, taken one at a time": (2, [["0F0", "0F1", "[0SEND_F0 0SEND_F1]", "0RECV_B0", "0B0",
                                                         "0RECV_B1", "0B1"],
                                                        ["1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1",
                                                         "1B1", "1SEND_B1"]]),
    "1F1B, groups matched one to one (valid everywhere)": (2, [["0F0", "0F1", "0SEND_F0", "[0SEND_F1 0RECV_B0]",
                                                                 "0B0", "0RECV_B1", "0B1"],
                                                                ["1RECV_F0", "1F0", "1B0", "[1SEND_B0 1RECV_F1]",
                                                                 "1F1", "1B1", "1SEND_B1"]]),
}


def predictions(microbatches: int, rows: list[list[str]]) -> dict[str, bool]:
    """Per semantics, whether pipeforge says the case completes."""
    from pipeforge.ir import Placement, Schedule, programs_from_tokens
    from pipeforge.verifier import verify

    schedule = Schedule("case", 2, 2, microbatches, (Placement.loop(2, 2),), programs_from_tokens(rows))
    return {semantics: verify(schedule, semantics=semantics).valid for semantics in SEMANTICS}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, port: int, backend: str, rows: list[list[str]], numel: int, warm: bool, done) -> None:
    try:
        run_rank(rank, port, backend, rows, numel, warm, done)
    except RuntimeError:  # the peer was stopped after a hang: the parent has recorded it
        sys.exit(1)


def run_rank(rank: int, port: int, backend: str, rows: list[list[str]], numel: int, warm: bool, done) -> None:
    import torch
    import torch.distributed as dist

    from pipeforge.ir import programs_from_tokens

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            device_id=device if backend == "nccl" else None)
    peer = 1 - rank
    program = programs_from_tokens(rows)[rank]
    done.value = 1  # started: the timeout counts from here (importing torch may take long on a busy machine)
    if warm:
        exchange(dist, [dist.P2POp(dist.isend, torch.ones(numel, device=device), peer),
                        dist.P2POp(dist.irecv, torch.empty(numel, device=device), peer)])
        run_program(dist, torch, program, peer, numel, device)  # the case's own connections, once
    run_program(dist, torch, program, peer, numel, device)
    if backend == "nccl":
        torch.cuda.synchronize()
    done.value = 2
    dist.destroy_process_group()


def run_program(dist, torch, program, peer: int, numel: int, device) -> None:
    value = torch.zeros(numel, device=device)
    for step in program:
        if not step.actions:
            continue
        if not step.is_group:
            value = value + 1  # a compute step
            continue
        ops = [dist.P2POp(dist.isend if "SEND" in action.kind.value else dist.irecv,
                          value if "SEND" in action.kind.value else torch.empty(numel, device=device), peer)
               for action in step.actions]
        exchange(dist, ops)


def exchange(dist, ops) -> None:
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def run_case(backend: str, rows, numel: int, warm: bool, timeout: float) -> bool:
    """Whether both ranks finish within ``timeout`` seconds."""
    context = mp.get_context("spawn")
    port = free_port()
    flags = [context.Value("i", 0) for _ in range(2)]
    procs = [context.Process(target=rank_main, args=(rank, port, backend, rows, numel, warm, flags[rank]),
                             daemon=True) for rank in range(2)]
    for proc in procs:
        proc.start()
    started = time.monotonic() + 600
    while time.monotonic() < started and any(flag.value == 0 for flag in flags) and all(p.is_alive() for p in procs):
        time.sleep(0.05)
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0.1))
    finished = all(flag.value == 2 for flag in flags)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    return finished


def consistent_models(outcomes: list[tuple[dict[str, bool], bool]]) -> list[str]:
    return [s for s in SEMANTICS if all(predicted[s] == completed for predicted, completed in outcomes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds after which a case counts as hung")
    parser.add_argument("--sizes", default="1,4194304", help="message sizes in elements, comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    results = []
    for phase, warm in (("first step", False), ("steady state", True)):
        for numel in map(int, args.sizes.split(",")):
            outcomes = []
            for name, (microbatches, rows) in CASES.items():
                predicted = predictions(microbatches, rows)
                completed = run_case(args.backend, rows, numel, warm, args.timeout)
                outcomes.append((predicted, completed))
                results.append({"phase": phase, "elements": numel, "case": name, "completed": completed,
                                "predicted": predicted})
                if not args.json:
                    said = ", ".join(f"{s}: {'completes' if ok else 'deadlock'}" for s, ok in predicted.items())
                    print(f"[{args.backend}, {phase}, {numel} elements] {name}: "
                          f"{'completed' if completed else 'HUNG'} ({said})", flush=True)
            models = consistent_models(outcomes)
            results.append({"phase": phase, "elements": numel, "followed": models})
            if not args.json:
                followed = ", ".join(models) or "none of the three"
                print(f"[{args.backend}, {phase}, {numel} elements] followed: {followed}", flush=True)
    if args.json:
        print(json.dumps({"backend": args.backend, "results": results}))


if __name__ == "__main__":
    main()
