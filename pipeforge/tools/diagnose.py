"""``pipeforge diagnose DIR``: where every rank of a failed or hung step was, and the wait cycle.

``diagnose(directory, modules=None)`` -> ``Diagnosis``: from the records ranks leave in DIR
(``runtime/records.py``) and the generated module each names (read with ``ast``, hand edits included),
each rank's state and statement, and the wait chain followed from rank to rank until a rank repeats (a
deadlock) or the chain ends, told as ``verify`` tells a deadlock, with carets. Bad input (no records, a
truncated or foreign file, several schedules or steps, a missing rank, a changed or missing module)
raises ``UsageError`` naming the file. ``docs/torch.md`` (After a hang).
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeforge.errors import Argument, Source, Span, UsageError, words
from pipeforge.files import read_bounded, without_bom
from pipeforge.ir import COMM_KINDS, Action, parse_action
from pipeforge.runtime.records import FORMAT
from pipeforge.semantics import RUNTIME_METHODS, partner, peer_stage
from pipeforge.verifier.report import Hop, Violation, describe_cycle
from pipeforge.resources import library_dir

KIND_OF_METHOD = {method: kind for kind, method in RUNTIME_METHODS.items()}
# "# TOKEN FILE:LINE:COL step N": a group token is bracketed; the file may be quoted (older modules) or bare
COMMENT = re.compile(r"#\s*(?P<token>\[[^\]]*\]|\S+)(?:\s+(?P<file>.+?):(?P<line>\d+):(?P<col>\d+))?"
                     r"(?:\s+step\s+(?P<step>\d+))?\s*$")
RECORD_KEYS = ("format", "schedule", "fingerprint", "ranks", "rank", "module", "step_index", "state", "phase",
               "last_started", "last_finished", "waiting_for", "posted_unfinished")


@dataclass(frozen=True)
class Statement:
    """One statement of a rank function: its actions, its token, its place in the .pipe source."""

    index: int
    actions: tuple[Action, ...]
    token: str
    step: int | None
    span: Span | None = field(default=None, compare=False)
    module_line: int = 0


@dataclass(frozen=True)
class RankState:
    rank: int
    record: dict
    position: int | None  # the statement it was at (None: it finished its program)
    statement: Statement | None
    awaits: tuple[Action, ...]  # the communication it waited to complete
    how: str  # "waits", "stopped", "finishing", "finished"


@dataclass(frozen=True)
class Diagnosis:
    schedule: str
    step_index: int
    directory: str
    ranks: tuple[RankState, ...]
    hops: tuple[Hop, ...]
    cycle: bool
    end: str  # how a chain that is not a cycle ends

    def to_json(self) -> dict:
        return {
            "schedule": self.schedule, "step_index": self.step_index, "cycle": self.cycle, "end": self.end or None,
            "ranks": [rank_json(state) for state in self.ranks],
            "hops": [{"rank": h.rank, "step": h.step, "action": h.step_text, "waits_for": h.waits_for,
                      "peer": h.peer, "location": str(h.span) if h.span else None} for h in self.hops],
        }

    def render(self) -> str:
        lines = [(f"schedule {self.schedule!r}, step {self.step_index}: records of {len(self.ranks)} ranks in "
                 f"{self.directory}")]
        lines += [render_state(state) for state in self.ranks]
        if not self.hops:
            lines.append("no rank waits for another" + (f": {self.end}" if self.end else ""))
            return "\n".join(lines)
        first = self.hops[0]
        message = describe_cycle(self.hops) + (", and so on round the cycle" if self.cycle else f"; {self.end}")
        violation = Violation("deadlock" if self.cycle else "wait", message, first.rank, first.step,
                              str(first.span) if first.span else None, first.span, cycle=self.hops)
        lines.append("wait cycle:" if self.cycle else "wait chain:")
        lines.append(violation.render())
        return "\n".join(lines)


def rank_json(state: RankState) -> dict:
    statement = state.statement
    return {"rank": state.rank, "state": state.record["state"], "how": state.how, "step": state.position,
            "action": statement.token if statement else None,
            "location": str(statement.span) if statement and statement.span else None,
            "awaits": [str(a) for a in state.awaits], "posted_unfinished": state.record["posted_unfinished"],
            "last_finished": state.record["last_finished"], "error": state.record.get("error"),
            "host": state.record.get("host")}


def render_state(state: RankState) -> str:
    record, statement = state.record, state.statement
    where = "finished its program" if statement is None else \
        f"at statement {state.position} ({statement.token}{' ' + str(statement.span) if statement.span else ''})"
    text = f"  rank {state.rank} [{record['state']}, host {record.get('host')}, pid {record.get('pid')}]: {where}"
    if state.awaits:
        text += f", {'waiting for' if state.how != 'finishing' else 'finishing, waiting for its sends'} " \
                f"{' '.join(map(str, state.awaits))}"
    elif state.how == "stopped":
        text += ", stopped inside it"
    if record["posted_unfinished"]:
        text += f"; posted, not complete: {' '.join(record['posted_unfinished'])}"
    if record.get("error"):
        text += f"\n      error: {first_line(record['error'])}"
    return text


def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 300 else line[:297] + "..."


# --- reading ------------------------------------------------------------------------------------


def read_records(directory: str | Path) -> list[dict]:
    """Every rank's record in ``directory``, checked to belong together and to cover every rank."""
    folder = Path(directory)
    if not folder.is_dir():
        raise UsageError(f"{str(folder)!r} is not a directory of records (make_pipeline(records=DIR) or "
                         f"PIPEFORGE_RECORDS names it)")
    paths = sorted(folder.glob("rank-*.json"))
    if not paths:
        raise UsageError(f"{str(folder)!r} holds no records (rank-<r>.json); a rank writes one when its step fails "
                         f"or outlasts make_pipeline's timeout")
    records = [read_record(path) for path in paths]
    check_together(records, paths)
    return sorted(records, key=lambda r: r["rank"])


def read_record(path: Path) -> dict:
    from pipeforge.files import JsonError, read_json

    try:
        record = read_json(path, "record")  # a regular file of at most 4 MiB, JSON within bounds
    except JsonError as error:
        raise UsageError(f"{str(path)!r}: not a complete record (truncated or damaged: {error.problem} at "
                         f"{error.where})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UsageError(f"{str(path)!r}: not a pipeforge record (expected format {FORMAT!r})")
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise UsageError(f"{str(path)!r}: the record lacks {', '.join(missing)}")
    if not isinstance(record["rank"], int) or not isinstance(record["ranks"], int):
        raise UsageError(f"{str(path)!r}: rank and ranks must be integers")
    record["path"] = str(path)
    return record


def check_together(records: list[dict], paths: list[Path]) -> None:
    first = records[0]
    for record, path in zip(records, paths):
        if (record["schedule"], record["fingerprint"]) != (first["schedule"], first["fingerprint"]):
            raise UsageError(f"{str(path)!r} is a record of schedule {record['schedule']!r} "
                             f"({record['fingerprint']}), {str(paths[0])!r} of {first['schedule']!r} "
                             f"({first['fingerprint']}): records of another schedule; give one run's directory")
        if record["step_index"] != first["step_index"]:
            raise UsageError(f"{str(path)!r} records step {record['step_index']}, {str(paths[0])!r} step "
                             f"{first['step_index']}: records of different steps (an earlier run's left behind?)")
        if path.name != f"rank-{record['rank']}.json":
            raise UsageError(f"{str(path)!r} holds the record of rank {record['rank']}")
    present = {record["rank"] for record in records}
    absent = [rank for rank in range(first["ranks"]) if rank not in present]
    if absent:
        raise UsageError(f"the records of ranks {absent} are missing from {str(paths[0].parent)!r} (schedule "
                         f"{first['schedule']!r} runs on {first['ranks']} ranks): every rank writes one when its "
                         f"step fails or outlasts the timeout; a rank killed outright leaves none")


def read_program(record: dict, module_override: str | None = None) -> list[Statement]:
    """The statements of the record's rank function, from the generated module that ran."""
    path = Path(module_override or record["module"] or "")
    try:  # a regular file within bounds: a FIFO or a device named here must not block or stream forever
        text = read_bounded(path, "generated module").decode("utf-8")
    except (UsageError, UnicodeDecodeError) as error:
        raise UsageError(words(f"rank {record['rank']}: cannot read the generated module {str(path)!r} that ran: "
                               f"{error}; name it with ", Argument("module"))) from None
    digest = record.get("module_sha256")
    if module_override is None and digest and hashlib.sha256(text.encode()).hexdigest() != digest:
        raise UsageError(f"{str(path)!r} has changed since rank {record['rank']} ran it (its SHA-256 differs "
                         f"from the record's): the records cannot be read against it")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as error:
        where = f"{path!s}:{error.lineno}" if error.lineno else repr(str(path))
        raise UsageError(f"{where}: not a Python module: {error.msg}") from None
    except (ValueError, RecursionError, MemoryError):  # NUL bytes; nesting past the parser's own stack
        raise UsageError(f"{str(path)!r}: not a Python module pipeforge wrote (it does not parse)") from None
    function = next((node for node in tree.body if isinstance(node, ast.FunctionDef)
                     and node.name == f"rank_{record['rank']}"), None)
    if function is None:
        raise UsageError(f"{str(path)!r} has no function rank_{record['rank']}: not the module that ran")
    return statements(function, text.splitlines(), path.parent)


def statements(function: ast.FunctionDef, lines: list[str], folder: Path) -> list[Statement]:
    found: list[Statement] = []
    sources: dict[str, Source | None] = {}
    for node in function.body:
        actions = node_actions(node)
        if not actions:
            continue
        token, span, step = comment_of(lines[node.lineno - 1], sources, folder)
        found.append(Statement(len(found), actions, token or " ".join(map(str, actions)), step, span, node.lineno))
    return found


def node_actions(node: ast.stmt) -> tuple[Action, ...]:
    if isinstance(node, ast.With):
        return tuple(action for inner in node.body for action in node_actions(inner))
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return ()
    call = node.value
    if method_of(call) == "post":
        return post_actions(call)
    return call_actions(call)


def post_actions(call: ast.Call) -> tuple[Action, ...]:
    """The actions a ``post(...)`` names: its token literals (``post('1SEND_B0')``) or, in modules generated
    before, its calls (``post(send_f(1, 0))``); anything else names none."""
    found: list[Action] = []
    for arg in call.args:
        if isinstance(arg, ast.Call):
            found += call_actions(arg)
        elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            try:
                action = parse_action(arg.value)
            except ValueError:
                continue
            if action.kind in COMM_KINDS:
                found.append(action)
    return tuple(found)


def method_of(call: ast.Call) -> str | None:
    """The rank context's method a generated call makes: ``forward(0, 1)`` (bound to its name at the
    function's start) or ``ctx.forward(0, 1)`` (modules generated before)."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def call_actions(call: ast.Call) -> tuple[Action, ...]:
    kind = KIND_OF_METHOD.get(method_of(call) or "")
    if kind is None:
        return ()
    values = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, int)]
    if len(values) != len(call.args) or not values:
        return ()
    if kind.value in ("REDUCE_GRAD", "UNSHARD", "RESHARD"):
        return (Action(values[0], kind, None, values[1] if len(values) > 1 else 0),)
    return (Action(values[0], kind, values[1], values[2] if len(values) > 2 else 0),)


def comment_of(line: str, sources: dict, folder: Path) -> tuple[str | None, Span | None, int | None]:
    hash_at = line.find("#")
    match = COMMENT.search(line[hash_at:]) if hash_at >= 0 else None
    if match is None:
        return None, None, None
    step = int(match["step"]) if match["step"] else None
    if not match["file"]:
        return match["token"], None, step
    name = match["file"]
    if name[0] in "'\"" and name[-1] == name[0]:
        try:
            name = ast.literal_eval(name)
        except (ValueError, SyntaxError):
            pass
    if name not in sources:
        sources[name] = find_source(name, folder)
    source = sources[name]
    row, col = int(match["line"]), int(match["col"])
    width = len(match["token"]) if not match["token"].startswith("[") else 1
    span = source.span(row, col, row, col + width) if source else Span(name, row, col, row, col + width)
    return match["token"], span, step


def find_source(name: str, folder: Path) -> Source | None:
    """The .pipe (or CSV) text a location names: as given, beside the module or up to three folders
    above it, or in the library."""
    near = [folder, *list(folder.parents)[:3]]  # a rank's file sits in a folder beside the main module
    for candidate in (Path(name), *(place / name for place in near), library_dir() / Path(name).name):
        try:
            return Source(name, without_bom(read_bounded(candidate, "schedule file")).decode("utf-8"))
        except (UsageError, UnicodeDecodeError):  # missing, a FIFO or device, too large, not text
            continue
    return None


# --- the diagnosis ------------------------------------------------------------------------------


def diagnose(directory: str | Path, *, modules: dict[int, str] | None = None) -> Diagnosis:
    """Read ``directory``'s records and the modules they name; say where each rank was and who waits for whom."""
    records = read_records(directory)
    programs = {r["rank"]: read_program(r, (modules or {}).get(r["rank"])) for r in records}
    states = tuple(rank_state(record, programs[record["rank"]]) for record in records)
    placement = placement_of(programs)
    hops, cycle, end = wait_chain(states, programs, placement)
    first = records[0]
    return Diagnosis(first["schedule"], first["step_index"], str(directory), states, hops, cycle, end)


def actions_of(text: str | None) -> tuple[Action, ...]:
    if not text:
        return ()
    try:
        return tuple(parse_action(part) for part in text.strip("[]").split())
    except ValueError:
        return ()


def rank_state(record: dict, program: list[Statement]) -> RankState:
    rank = record["rank"]
    if record["phase"] in ("finish", "done"):
        sends = tuple(a for a in map(parse_action, record["posted_unfinished"]) if "SEND" in a.kind.value)
        how = "finishing" if sends else "finished"
        return RankState(rank, record, None, None, sends, how)
    started = actions_of(record["last_started"])
    position = find_statement(program, started)
    statement = program[position] if position is not None else None
    waiting = actions_of(record["waiting_for"])
    if waiting:
        return RankState(rank, record, position, statement, waiting, "waits")
    if statement is not None and statement.actions[0].is_comm and record["last_finished"] != record["last_started"]:
        receives = tuple(a for a in statement.actions if "RECV" in a.kind.value)
        return RankState(rank, record, position, statement, receives[:1], "waits")
    if position is not None and statement is not None and record["last_finished"] == record["last_started"]:
        position = position + 1 if position + 1 < len(program) else None
        statement = program[position] if position is not None else None
    return RankState(rank, record, position, statement, (), "stopped" if statement else "finished")


def find_statement(program: list[Statement], actions: tuple[Action, ...]) -> int | None:
    if not actions:
        return 0 if program else None
    wanted = set(actions)
    for statement in program:
        if wanted <= set(statement.actions):
            return statement.index
    return None


def placement_of(programs: dict[int, list[Statement]]) -> dict[tuple[int, int], int]:
    """(stage, chain) -> rank, from where the compute actions are."""
    owner: dict[tuple[int, int], int] = {}
    for rank, program in programs.items():
        for statement in program:
            for action in statement.actions:
                if action.is_compute:
                    owner.setdefault((action.stage, action.chain), rank)
    return owner


def wait_chain(states, programs, placement) -> tuple[tuple[Hop, ...], bool, str]:
    """Follow each wait to the rank that must post its partner, until a rank repeats or the chain ends."""
    by_rank = {state.rank: state for state in states}
    start = next((s for s in states if s.awaits), None)
    if start is None:
        stopped = [s for s in states if s.how == "stopped"]
        return (), False, (f"rank {stopped[0].rank} stopped at {stopped[0].statement.token}" if stopped else "")
    hops: list[Hop] = []
    seen: dict[int, int] = {}
    state = start
    while True:
        seen[state.rank] = len(hops)
        awaited = state.awaits[0]
        peer = placement.get((peer_stage(awaited), awaited.chain))
        wanted = Action(*partner(awaited))
        peer_index = index_of(programs.get(peer, []), wanted)
        statement = state.statement
        hops.append(Hop(state.rank, state.position, statement.token if statement else "finish", str(awaited), peer,
                        statement.span if statement else None, peer_step=peer_index))
        if peer is None:
            return tuple(hops), False, f"no rank runs stage {peer_stage(awaited)}"
        other = by_rank[peer]
        if peer_index is None:
            return tuple(hops), False, f"rank {peer}'s program never posts {wanted}"
        if other.position is None or peer_index < other.position:
            return tuple(hops), False, (f"rank {peer} posted {wanted} at statement {peer_index} (the data went to "
                                       f"another receive, or is still in flight)")
        if peer in seen:
            return tuple(hops[seen[peer]:]) if seen[peer] else tuple(hops), True, ""
        if not other.awaits:
            error = other.record.get("error")
            doing = other.statement.token if other.statement else "its program's end"
            return tuple(hops), False, (f"rank {peer} stopped at {doing} before posting {wanted}" +
                                        (f" ({first_line(error)})" if error else ""))
        state = other


def index_of(program: list[Statement], action: Action) -> int | None:
    return next((s.index for s in program if action in s.actions), None)
