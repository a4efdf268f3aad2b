"""``split`` + ``make_pipeline`` on gloo ranks equals the unpipelined model in float64, every family.

One spawned group per process count runs every case in a row (``pipeline_jobs``):
on 2 ranks every library schedule with the tied Llama, GPT-2 and both MoE models
(the balancing loss through the auxiliary channel), and 1F1B and ZBV with every
family; on 4 ranks a loop, an interleaved, a V and both bidirectional
schedules with a tied, a sliding-window, an MoE and a layer-list model; on 2
ranks each further family (``families.WORLD``: Gemma 2 and 3, Phi, OLMo 2,
GPT-NeoX, Falcon, Qwen3, Cohere, StableLM, Starcoder2, GPT-J, BLOOM, Granite,
GraniteMoE, OLMoE, gpt-oss, DeepSeek-V3, Jamba, LFM2, Llama 4, Mamba, Falcon-Mamba, Mamba-2) with one of 1F1B, ZB-H1,
interleaved 1F1B, ZBV, DualPipeV and 1F1B with recompute, in turn (the slow
tier: each with three of the six, ``WORLD_SLOW``, so that every pair of schedules
meets on some family and every schedule runs 13 or 14 of the 27), and on 4 ranks Falcon, Gemma 3
and the tied BLOOM on interleaved 1F1B, DualPipeV and Chimera. Every
model is built on the meta device and each rank materializes only its stages;
batches are padded, the loss is the batch's token mean (``TokenMeanLoss``).
Losses, every gradient after each step and every parameter after two SGD steps
agree to rounding (the token sums run in another order). The slow tier runs
every library schedule with every family on 2 and 4 ranks.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.library import names
from pipeforge.tools.launch import spawn
from tests.models import families
from tests.models.pipeline_jobs import Case

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1200)]

ROUNDING = 1e-12
EVERY_SCHEDULE = ("llama-tied", "gpt2", "mixtral", "qwen2-moe")
FOUR_RANKS = {"schedules": ("1f1b", "interleaved-1f1b", "zbv", "chimera", "dualpipev"),
              "families": ("llama-tied", "qwen2", "mixtral", "layer-list"),
              "world": {"interleaved-1f1b": ("falcon",), "dualpipev": ("gemma3",), "chimera": ("bloom",)}}
WORLD_SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zbv", "dualpipev", "1f1b-recompute")
# family i's offsets into WORLD_SCHEDULES in the slow tier, from its fast-tier one: {0, 1, 3} is a difference
# set mod 6 up to 3 (every difference 1, 2, 3 occurs), so every two schedules run one family together
WORLD_SLOW = (0, 1, 3)


def load(name: str, ranks: int):
    for microbatches in (ranks, 2 * ranks):
        try:
            return pipeforge.load(name, defines={"P": ranks, "M": microbatches})
        except pipeforge.SemanticError:
            continue
    raise AssertionError(f"{name} accepts neither M={ranks} nor M={2 * ranks}")


def cases(ranks: int, out_dir, full: bool | str = False) -> list[Case]:
    """The representative set (``full``: every library schedule with every family; ``"world"``: every further
    family with three schedules of ``WORLD_SCHEDULES``, ``WORLD_SLOW``)."""
    if full == "world":
        return world_cases(ranks, out_dir, WORLD_SLOW)
    found = [] if ranks != 2 or full else world_cases(ranks, out_dir)
    schedules = names() if ranks == 2 or full else FOUR_RANKS["schedules"]
    for name in schedules:
        path = str(codegen(load(name, ranks), out_dir / name))
        if full:
            chosen = families.FAMILIES
        elif ranks == 2:
            chosen = families.FAMILIES if name in ("1f1b", "zbv") else EVERY_SCHEDULE
        else:
            chosen = FOUR_RANKS["families"] + FOUR_RANKS["world"].get(name, ())
        found += [Case(f"{name} {family}", family, path) for family in chosen]
    return found


def world_cases(ranks: int, out_dir, offsets: tuple[int, ...] = (0,)) -> list[Case]:
    """Each further family i with the schedules of ``WORLD_SCHEDULES`` at i plus each of ``offsets`` (mod 6)."""
    paths = {name: str(codegen(load(name, ranks), out_dir / f"world-{name}")) for name in WORLD_SCHEDULES}
    found = []
    for i, family in enumerate(families.WORLD):
        for offset in offsets:
            name = WORLD_SCHEDULES[(i + offset) % len(WORLD_SCHEDULES)]
            found.append(Case(f"{name} {family}", family, paths[name]))
    return found


_RESULTS: dict[tuple[int, bool | str], dict[str, list[dict]]] = {}


@pytest.fixture
def results(request, tmp_path_factory):
    ranks, full = request.param
    if (ranks, full) not in _RESULTS:
        chosen = cases(ranks, tmp_path_factory.mktemp(f"split{ranks}"), full)
        outcomes = spawn("tests.models.pipeline_jobs:run_cases", ranks, chosen, timeout=90,
                         deadline=2300 if full else 1300)
        assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
        _RESULTS[ranks, full] = {case.label: [o.value[i] for o in outcomes] for i, case in enumerate(chosen)}
    return _RESULTS[ranks, full]


@pytest.mark.parametrize("results", [(2, False), (4, False)], indirect=True, ids=["2-ranks", "4-ranks"])
def test_split_models_train_as_the_unpipelined_model(results):
    assert_equal_to_unpipelined(results)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("results", [(2, True), (4, True)], indirect=True, ids=["2-ranks", "4-ranks"])
def test_every_family_on_every_library_schedule(results):
    assert_equal_to_unpipelined(results)


@pytest.mark.slow
@pytest.mark.parametrize("results", [(2, "world")], indirect=True, ids=["2-ranks"])
def test_every_further_family_on_loop_v_and_recompute_schedules(results):
    assert_equal_to_unpipelined(results)


def assert_equal_to_unpipelined(results):
    failures = []
    for label, reports in results.items():
        worst = max(reports, key=lambda r: r["max_rel"])
        missing = [m for r in reports for m in r["missing"]]
        if worst["max_rel"] > ROUNDING or missing or not all(r["compared"] for r in reports):
            failures.append(f"{label}: max_rel {worst['max_rel']:.3g} at {worst['worst']} (rank {worst['rank']}); "
                            f"missing {missing[:3]}")
    assert not failures, "\n".join(failures)
