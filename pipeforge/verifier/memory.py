"""The memory check: the first step on each rank whose additions take what it holds over the limit."""

from __future__ import annotations

from pipeforge.ir import MemorySpec
from pipeforge.semantics import effects_of, held_after_additions, within_limit
from pipeforge.verifier.program import Program, violation_at
from pipeforge.verifier.report import Violation


def check_memory(program: Program, limit: float | None, memory: MemorySpec) -> list[Violation]:
    """The first step on each rank whose additions take what it holds (activations, and gathered
    parameters where ``memory.unsharded`` sizes them) over ``limit``: ``semantics.stage_effect`` of
    every action, walked by ``semantics.held_after_additions`` (simulate's peak is the same walk)."""
    if limit is None:
        return []
    effect_of = effects_of(memory, (key for row in program.slots for slot in row for key in slot.acts))
    if not memory.uniform or any(key[1] == "R" for row in program.slots for slot in row for key in slot.acts):
        what = "M_B of activations"
    else:
        what = "microbatches of activations" + (" and unsharded parameters" if memory.unsharded else "")
    return _first_over_limit(program, limit, effect_of, what)


def _first_over_limit(program: Program, limit: float, effect_of, what: str) -> list[Violation]:
    """Per rank, the first step whose additions (an overlap step's count first) take the held memory
    over ``limit``; ``effect_of(key)`` is an action's (added, released)."""
    found = []
    for row in program.slots:
        slots = [slot for slot in row if not slot.group]
        walk = held_after_additions([effect_of(key) for key in slot.acts] for slot in slots)
        for slot, held in zip(slots, walk):
            if not within_limit(held, limit):
                found.append(violation_at("memory", f"rank {slot.rank} holds {held:g} {what} at {slot.text}, "
                                          f"over the limit {limit:g}", slot))
                break
    return found
