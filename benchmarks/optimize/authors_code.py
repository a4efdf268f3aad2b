"""The Zero Bubble authors' own schedulers, run unchanged from a fetched copy of their repository.

sail-sg/zero-bubble-pipeline-parallelism is not vendored (its code is not ours to
commit): set ``ZB_AUTHORS_REPO`` to a clone or bare mirror of it, or leave the
default path of this workplace's mirror. When neither exists, ``load()``
returns None and the benchmarks skip the authors' column.

Their modules are read from the repository's HEAD with ``git show`` and executed
as they are, under their own module names; the package ``__init__`` files (which
pull in the whole of Megatron) are replaced by empty packages, and ``pulp``
(imported by ``zb.py`` only for its ILP refinement, which is not run here) by an
empty module when it is not installed.

The adapters turn their output into pipeforge orders (per rank, tuples of
``(chain, stage, kind, microbatch)``) so that pipeforge's evaluator times both
sides the same way:

- ``zb_heuristic``: ``zb.initial_solution`` (``Graph.manual_order`` under its
  eight settings, the best kept): ZB-1p / ZB-2p, one stage a rank;
- ``zbv_heuristic``: ``zbv.PipelineGraph.create_schedule``: ZB-V, two chunks a
  rank in a V, each chunk costing half a stage; the memory limit is in units
  of a whole stage's activations (``p`` is ZB-V's default, "1p").
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import time
import types
from dataclasses import dataclass

DEFAULT_REPO = "/work/.mirror/sail-sg+zero-bubble-pipeline-parallelism/repo"
PACKAGE = "megatron.core.pipeline_parallel.zerobubble.scheduler"
MEMORY_SCALE = 1000  # their memory checks add numbers: integers keep f + b + w == 0 exact


@dataclass(frozen=True)
class Authors:
    graph: types.ModuleType
    zb: types.ModuleType
    zbv: types.ModuleType
    commit: str


@dataclass(frozen=True)
class TheirOrder:
    keys: tuple[tuple[tuple[int, int, str, int], ...], ...]
    seconds: float


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={_git_dir(repo)}", *args], check=True, capture_output=True,
                          text=True).stdout


def _git_dir(repo: str) -> str:
    inner = os.path.join(repo, ".git")
    return inner if os.path.isdir(inner) else repo


def _package(name: str) -> None:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix not in sys.modules:
            module = types.ModuleType(prefix)
            module.__path__ = []
            sys.modules[prefix] = module


def _module(repo: str, name: str) -> types.ModuleType:
    source = _git(repo, "show", f"HEAD:{PACKAGE.replace('.', '/')}/{name}.py")
    module = types.ModuleType(f"{PACKAGE}.{name}")
    sys.modules[module.__name__] = module
    exec(compile(source, f"{PACKAGE}/{name}.py", "exec"), module.__dict__)
    return module


def load(repo: str | None = None) -> Authors | None:
    """Their scheduler modules, or None when their repository is not here."""
    repo = repo or os.environ.get("ZB_AUTHORS_REPO", DEFAULT_REPO)
    if not os.path.isdir(repo):
        return None
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    _package(PACKAGE)
    if importlib.util.find_spec("pulp") is None:
        sys.modules.setdefault("pulp", types.ModuleType("pulp"))
    graph = _module(repo, "graph")
    return Authors(graph, _module(repo, "zb"), _module(repo, "zbv"), commit)


def zb_heuristic(authors: Authors, p: int, m: int, costs, weights: float, limit: float) -> TheirOrder:
    """ZB-1p / ZB-2p as their ``initial_solution`` builds it; ``limit`` in M_B."""
    f_mem, w_mem = MEMORY_SCALE, -round(weights * MEMORY_SCALE)
    config = authors.graph.GraphConfig(
        cost_f=[float(costs.F)] * p, cost_b=[float(costs.I)] * p, cost_w=[float(costs.W)] * p,
        cost_comm=float(costs.comm), mem_f=[f_mem] * p, mem_b=[-f_mem - w_mem] * p, mem_w=[w_mem] * p,
        max_mem=[limit * MEMORY_SCALE] * p, n_stages=p, n_micro=m)
    started = time.process_time()  # CPU seconds: the machine is shared, and ours are timed the same way
    graph = authors.zb.Graph.build_graph(p, m, config)
    _, order, _ = authors.zb.initial_solution(graph, print_result=False)
    seconds = time.process_time() - started
    letters = "FIW"
    programs = []
    for stage in range(p):
        ids = [graph.get_id(kind, stage, mb) for kind in range(3) for mb in range(m)]
        ids.sort(key=lambda i: order[i])
        programs.append(tuple((stage, letters[i // (p * m)], i % m, 0) for i in ids))  # an Action's layout
    return TheirOrder(tuple(programs), seconds)


def zbv_heuristic(authors: Authors, p: int, m: int, costs, weights: float, limit: float) -> TheirOrder:
    """ZB-V as their ``create_schedule`` builds it: chunk costs half a stage's, ``limit`` in stage M_B."""
    half = {k: float(v) / 2 for k, v in (("F", costs.F), ("I", costs.I), ("W", costs.W))}
    f_mem, w_mem = MEMORY_SCALE, -round(weights * MEMORY_SCALE)
    config = authors.graph.GraphConfig(
        cost_f=[half["F"]] * p, cost_b=[half["I"]] * p, cost_w=[half["W"]] * p, cost_comm=float(costs.comm),
        mem_f=[f_mem] * p, mem_b=[-f_mem - w_mem] * p, mem_w=[w_mem] * p, max_mem=None,
        max_chunks=2, n_stages=p, n_micro=m)
    started = time.process_time()
    graph = authors.zbv.PipelineGraph(p, m, half["F"], half["I"], half["W"], float(costs.comm),
                                       f_mem, -f_mem - w_mem, w_mem, max_mem=2 * limit * MEMORY_SCALE)
    with contextlib.redirect_stdout(io.StringIO()):
        local_order = graph.create_schedule(config)
    seconds = time.process_time() - started
    letters = {"F": "F", "B": "I", "W": "W"}
    programs = tuple(tuple((node.layer_group_idx, letters[node.type.value], node.microbatch, 0) for node in nodes)
                     for nodes in local_order)
    return TheirOrder(programs, seconds)
