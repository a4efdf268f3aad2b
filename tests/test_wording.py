"""Library errors name arguments as Python does; only the command layer speaks in flags."""

from __future__ import annotations

import ast
import pickle
import re
from pathlib import Path

import pytest

import pipeforge
from pipeforge.commands import wording
from pipeforge.commands.exits import Exit
from pipeforge.errors import Argument, ArgumentError, UsageError, words

PACKAGE = Path(pipeforge.__file__).parent
COMMAND_LAYER = ("commands", "cli.py", "__main__.py")
FLAG = re.compile(r"(^|[\s'\"(])(--[a-z]|-[A-Za-z] )")


def _raised_texts(tree: ast.AST):
    """Every string literal inside a ``raise`` statement, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    yield part.lineno, part.value


def test_library_errors_name_no_flag():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in COMMAND_LAYER:
            continue
        for line, text in _raised_texts(ast.parse(path.read_text(encoding="utf-8"))):
            if FLAG.search(text):
                found.append(f"pipeforge/{relative}:{line}: {text!r}")
    assert not found, "library errors speak in flags (use errors.Argument):\n" + "\n".join(found)


@pytest.mark.parametrize("argument, python, flag", [
    (Argument("defines", "Q"), "defines['Q']", "-D Q"),
    (Argument("defines"), "defines", "-D"),
    (Argument("costs", "F=x"), "costs item 'F=x'", "--cost item 'F=x'"),
    (Argument("costs"), "costs", "--cost"),
    (Argument("memory_limit", value="0.0"), "memory_limit=0.0", "--memory-limit 0.0"),
    (Argument("stages", value="3"), "stages=3", "--stages 3"),
    (Argument("schedule", value="NAME"), "schedule=NAME", "--schedule NAME"),
    (Argument("strategy", value="local"), "strategy=local", "--strategy local"),
])
def test_an_argument_is_worded_for_python_and_for_the_command_line(argument, python, flag):
    assert str(argument) == python
    assert wording.flag(argument) == flag


def test_an_error_keeps_its_fields_and_is_worded_twice():
    error = pipeforge.errors.ArgumentError(Argument("defines", "Q"), "no such parameter", value=3)
    assert (error.argument.item, error.value, error.problem) == ("Q", 3, "no such parameter")
    assert str(error) == error.message == "defines['Q']: no such parameter"
    assert error.render() == "error: defines['Q']: no such parameter"
    assert wording.render(error) == "error: -D Q: no such parameter"
    both = UsageError(words(Argument("defines"), " and ", Argument("schedule"), " apply to .pipe files"))
    assert str(both) == "defines and schedule apply to .pipe files"
    assert wording.message(both) == "-D and --schedule apply to .pipe files"


def test_an_error_survives_pickling_with_its_fields():
    error = ArgumentError(Argument("costs", "F=x"), "'x' is not a number", value="F=x")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ArgumentError and str(again) == str(error) == "costs item 'F=x': 'x' is not a number"
    assert (again.argument, again.value, again.problem) == (error.argument, "F=x", "'x' is not a number")
    assert wording.message(again) == "--cost item 'F=x': 'x' is not a number"


def test_the_python_api_raises_without_flags():
    with pytest.raises(ArgumentError) as caught:
        pipeforge.load("1f1b", defines={"Q": 3})
    assert caught.value.argument == Argument("defines", "Q")
    assert str(caught.value).startswith("defines['Q']: schedule 'one_f_one_b' has no parameter 'Q'")
    with pytest.raises(UsageError, match=r"^defines and schedule apply"):
        pipeforge.load("x.csv", defines={"P": 2})


def test_exit_codes_are_the_contract():
    assert (Exit.OK, Exit.INVALID, Exit.USAGE, Exit.BUG, Exit.INTERRUPTED) == (0, 1, 2, 70, 130)
