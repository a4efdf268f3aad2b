"""Hostile .pipe text and arguments through the command line: bounded values, depth, numbers, carets, escapes.

Same contract as ``test_hostile_inputs.py``: exit 2 with the message at its
place, no traceback, no escape byte printed, within a memory cap and a time limit.
"""

from __future__ import annotations

import xml.dom.minidom
from pathlib import Path

import pytest

from pipeforge.generator import MAX_ACTIONS
from tests.hostile.test_hostile_inputs import assert_refused, pipeforge

HEAD = "schedule s {\n    ranks 1\n    stages 1 placement loop\n    microbatches 1\n"
TAIL = "    rank r { F(0, 0) B(0, 0) }\n}\n"


def program(*lines: str) -> str:
    return HEAD + "".join(f"    {line}\n" for line in lines) + TAIL


def check(tmp_path: Path, text: str | bytes, message: str, *, argv: tuple[str, ...] = ("verify",),
          code: int = 2) -> str:
    path = tmp_path / "t.pipe"
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    done = pipeforge([argv[0], "t.pipe", *argv[1:]], tmp_path)
    if code == 0:
        assert done.returncode == 0 and message in done.stdout.decode(), done.stderr
        return done.stdout.decode()
    assert_refused(done, message, code)
    return done.stderr.decode()


def test_chained_squarings_stop_at_the_size_bound_at_their_place(tmp_path):
    squarings = [f"let a{i + 1} = a{i} * a{i}" for i in range(27)]
    err = check(tmp_path, program("let a0 = 3", *squarings, "require a27 > 0"),
                "the result is too large a number (2 ** 256 or more)")
    assert err.startswith("t.pipe:13:14:")  # a8 = a7 * a7 is the first past 256 bits


@pytest.mark.parametrize("operator, count, total", [("+", 400, 400), ("-", 5000, -4998), ("*", 3000, 1)])
def test_a_long_flat_chain_works(tmp_path, operator, count, total):
    check(tmp_path, program(f"let a = {f' {operator} '.join(['1'] * count)}", f'require a == {total}, "sum"'),
          "valid", code=0)


def test_a_long_left_nested_chain_in_parentheses_works(tmp_path):
    check(tmp_path, program("let a = " + "(" * 3000 + "1" + " + 1)" * 3000, 'require a == 3001, "sum"'), "valid",
          code=0)


def test_a_long_condition_works(tmp_path):
    check(tmp_path, program(f"require {' and '.join(['1 == 1'] * 2000)}, \"all\""), "valid", code=0)


@pytest.mark.parametrize("expression, col", [
    ("-" * 5000 + "1", 110), ("not " * 500 + "1 == 1", 401), ("1 + (" * 300 + "1" + ")" * 300, 498),
    ("min(1, " * 300 + "1" + ")" * 300, 692),
])
def test_deep_nesting_is_refused_at_the_level_that_goes_past_the_bound(tmp_path, expression, col):
    err = check(tmp_path, program(f"let a = {expression}"), "nests more than 100 levels deep")
    assert err.startswith(f"t.pipe:5:{col}:"), err  # the 101st level's opening (a fixed bound, not the stack's)
    assert max(len(line) for line in err.splitlines()) < 200  # the source line shown is a window, not all of it


def test_deeply_nested_blocks_are_refused_at_their_place(tmp_path):
    blocks = "".join(f"for i{d} in 0 .. 1 {{ " for d in range(80)) + "}" * 80
    err = check(tmp_path, program(blocks), "nests more than 100 levels deep")
    assert err.startswith("t.pipe:5:")


def test_a_huge_integer_literal_is_refused_at_its_place(tmp_path):
    err = check(tmp_path, program("let a = " + "9" * 5000), "this integer has 5000 digits")
    assert err.startswith("t.pipe:5:13:")


@pytest.mark.parametrize("line, where", [
    ("costs { F = 1e308 * 10 }", "t.pipe:5:17:"), ("costs { F = 1e400 }", "t.pipe:5:17:"),
    ("costs { I = 1e-320 }", "t.pipe:5:17:"), ("costs { comm = 1e13 }", "t.pipe:5:20:"),
])
def test_costs_that_overflow_or_underflow_are_refused_at_their_place(tmp_path, line, where):
    err = check(tmp_path, program(line), "too large" if "1e308" in line or "1e400" in line else "between")
    assert err.startswith(where), err


@pytest.mark.parametrize("flag", ["F=1e-320", "F=1e300", "comm=5e-324"])
@pytest.mark.parametrize("command", ["simulate", "optimize"])
def test_a_cost_flag_past_the_range_is_refused_naming_it(tmp_path, command, flag):
    argv = [command, "1f1b", "--cost", flag] + (["-o", "out.pipe"] if command == "optimize" else [])
    assert_refused(pipeforge(argv, tmp_path), f"--cost item '{flag}': a nonzero cost must be between")


def test_a_cost_file_value_past_the_range_is_refused_naming_its_place(tmp_path):
    (tmp_path / "c.json").write_text('{"stages": [{"F": 1e-320, "I": 1, "W": 1}]}')
    assert_refused(pipeforge(["simulate", "1f1b", "-D", "P=1", "--costs", "c.json"], tmp_path),
                   "c.json: $.stages[0].F: a nonzero cost must be between")


# Bengali 4, Arabic-Indic 4, fullwidth 8, mathematical 8
@pytest.mark.parametrize("digit", ["\u09ea", "\u0664", "\uff18", "\U0001d7e0"])
def test_digits_are_ascii_only(tmp_path, digit):
    text = HEAD.replace("microbatches 1", f"microbatches {digit}") + TAIL
    err = check(tmp_path, text, "unexpected character")
    assert err.startswith("t.pipe:4:18:")


@pytest.mark.parametrize("digit", ["\u09ea", "\uff18"])
def test_flag_numbers_are_ascii_only(tmp_path, digit):
    assert_refused(pipeforge(["verify", "1f1b", "-D", f"P={digit}"], tmp_path), "must be an integer")
    assert_refused(pipeforge(["simulate", "1f1b", "--cost", f"F={digit}"], tmp_path), "is not a number")


def test_torch_tokens_take_ascii_digits_only(tmp_path):
    (tmp_path / "t.csv").write_text("0F\u09ea,0B\u09ea\n")
    assert_refused(pipeforge(["verify", "t.csv"], tmp_path), "t.csv:1:1")


# lark counts lines at "\n" only; the line shown under an error must be the line it names.
@pytest.mark.parametrize("separator", ["\f", "\r", "\u2028", "\u2029", "\x0b", "\x1c", "\x85"])
def test_the_caret_shows_the_line_lark_counted(tmp_path, separator):
    text = f"schedule s {{\n    # one{separator}two\n    ranks x\n}}\n"
    err = check(tmp_path, text, "undefined name 'x'")
    lines = err.splitlines()
    assert lines[0].startswith("t.pipe:3:11:") and lines[1] == "        ranks x" and lines[2] == " " * 14 + "^", err


def test_the_caret_counts_crlf_lines_as_lark_does(tmp_path):
    text = "schedule s {\r\n    # one\r\n    ranks x\r\n}\r\n"
    err = check(tmp_path, text, "undefined name 'x'")
    lines = err.splitlines()
    assert lines[0].startswith("t.pipe:3:11:") and lines[1] == "        ranks x" and lines[2] == " " * 14 + "^", err


def test_a_form_feed_in_a_comment_before_an_error_on_the_next_line(tmp_path):
    text = "schedule s {\n  # a\fb\n  ranks 1 stages 1 placement loop microbatches 1 rank r { F(0, 0) X }\n}\n"
    err = check(tmp_path, text, "t.pipe:3:")
    assert "F(0, 0) X" in err.splitlines()[1]


@pytest.mark.parametrize("payload", ["\x1b]0;pwned\x07", "\x1b[2J", "\x9b2J", "\u202e", "\x00"])
def test_control_characters_of_the_source_line_are_escaped(tmp_path, payload):
    text = f"schedule s {{\n    ranks x # {payload}\n}}\n"
    err = check(tmp_path, text, "undefined name 'x'")
    assert payload not in err
    caret_line = err.splitlines()[2]
    assert caret_line == " " * 14 + "^"


def test_control_characters_before_the_caret_keep_it_under_its_place(tmp_path):
    text = "schedule s {\n    ranks 1 \x1b\x1b stages x\n}\n"
    err = check(tmp_path, text, "unexpected character '\\x1b'")
    shown, caret = err.splitlines()[1:3]
    assert shown == "        ranks 1 \\x1b\\x1b stages x"
    assert caret == " " * 16 + "^^^^"


def test_a_require_message_with_control_characters_is_printed_escaped(tmp_path):
    text = program('require 1 == 2, "\x1b[31mred\x1b[0m"')
    err = check(tmp_path, text, "requirement failed: \\x1b[31mred\\x1b[0m")
    assert "\x1b" not in err


@pytest.mark.parametrize("suffix", [".svg", ".html"])
def test_a_title_with_control_characters_gives_well_formed_markup(tmp_path, suffix):
    done = pipeforge(["show", "1f1b", "--title", "a\x01b\x1b[2J\u202e", "-o", f"t{suffix}"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / f"t{suffix}").read_text()
    assert "\x01" not in text and "\x1b" not in text and "\\x01b\\x1b[2J\\u202e" in text
    if suffix == ".svg":
        xml.dom.minidom.parseString(text.encode())  # raises on a character XML cannot hold


def test_a_file_name_with_an_escape_is_printed_escaped(tmp_path):
    done = pipeforge(["verify", "\x1b[2J.pipe"], tmp_path)
    assert_refused(done, "\\x1b[2J.pipe")


def test_a_50_megabyte_file_of_idle_slots_is_refused_early(tmp_path):
    text = "schedule s {\n  ranks 1 stages 1 placement loop microbatches 1\n  rank 0 {" + " _" * (25 << 20) + " }\n}\n"
    (tmp_path / "idle.pipe").write_text(text)
    done = pipeforge(["verify", "idle.pipe"], tmp_path, cap=512 << 20, timeout=30)
    assert_refused(done, "may hold at most 32 MiB")


@pytest.mark.parametrize("slot, count, message", [
    (" _", 2_000_001, "more than 2000000 torch steps"),  # 4 MB: refused before any step is built
    (" idle", 250_001, "more than 250000 tokens"),  # each a statement: the parse stops at the bound
])
def test_a_file_of_idle_slots_is_refused_at_the_bound_in_bounded_memory(tmp_path, slot, count, message):
    text = "schedule s {\n  ranks 1 stages 1 placement loop microbatches 1\n  rank 0 {" + slot * count + " }\n}\n"
    (tmp_path / "idle.pipe").write_text(text)
    done = pipeforge(["verify", "idle.pipe"], tmp_path, cap=1 << 30, timeout=120)
    err = done.stderr.decode()
    assert_refused(done, message)
    assert err.startswith("idle.pipe:3:")


def test_codegen_past_its_documented_size_is_refused_before_lowering(tmp_path):
    done = pipeforge(["codegen", "1f1b", "-D", "P=1000", "-D", "M=1000", "-o", "big.py"], tmp_path, cap=2 << 30,
                     timeout=300)
    assert_refused(done, f"has 2000000 actions; codegen writes modules for at most {MAX_ACTIONS}")
    assert not (tmp_path / "big.py").exists()


@pytest.mark.parametrize("padding", ["#\n" * (12 << 20), "\n" * (24 << 20), " " * (24 << 20), "# x\r\n" * (4 << 20)])
def test_padding_costs_little_time_and_memory(tmp_path, padding):
    """24 MB of comments or blank lines before an error: lexed in runs, the error's line found without
    splitting the file (once: 110 s for the comments, 640 MB for the newlines)."""
    (tmp_path / "pad.pipe").write_text(padding + "schedule s { ranks x }\n", newline="")
    done = pipeforge(["verify", "pad.pipe"], tmp_path, cap=768 << 20, timeout=60)
    err = assert_refused(done, "undefined name 'x'")
    assert err.splitlines()[1].endswith("schedule s { ranks x }")


@pytest.mark.parametrize("argv, message", [
    (["codegen", "1f1b", "-o", ".", "--name", "m\u09ea"], "is not a Python identifier (ASCII letters"),
    (["codegen", "1f1b", "-o", "m\uff18.py"], "is not a Python identifier (ASCII letters"),
    (["verify", "1f1b", "-D", "P\u09ea=4"], "expected NAME=VALUE"),
])
def test_names_from_flags_are_ascii_identifiers(tmp_path, argv, message):
    assert_refused(pipeforge(argv, tmp_path), message)
    assert not list(tmp_path.iterdir())


BOM = b"\xef\xbb\xbf"  # what editors on Windows write at the start of a UTF-8 file


def test_a_byte_order_mark_is_skipped_and_columns_count_after_it(tmp_path):
    check(tmp_path, BOM + program().encode(), "valid", code=0)
    err = check(tmp_path, BOM + b"schedule s(P = 2) { ranks Q }\n", "undefined name 'Q'")
    assert err.startswith("t.pipe:1:27:") and "\n                              ^\n" in err  # under the Q
    err = check(tmp_path, BOM + b"schedule s\xff\n", "not UTF-8 text (byte 0xff)")
    assert err.startswith("t.pipe:1:11:")


def test_a_byte_order_mark_elsewhere_is_still_refused_at_its_place(tmp_path):
    assert check(tmp_path, program().encode() + BOM, "'\\ufeff'").startswith("t.pipe:7:1:")


def test_a_csv_and_a_cost_file_with_a_byte_order_mark_are_read(tmp_path):
    (tmp_path / "t.csv").write_bytes(BOM + b"0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    done = pipeforge(["verify", "t.csv"], tmp_path)
    assert done.returncode == 0 and b"valid" in done.stdout, done.stderr
    (tmp_path / "t.csv").write_bytes(BOM + b"0F0,0X0\n")
    assert_refused(pipeforge(["verify", "t.csv"], tmp_path), "t.csv:1:5: error: '0X0' is not an action")
    (tmp_path / "c.json").write_bytes(BOM + b'{"stages": [{"F": 2, "I": 1, "W": 1}, {"F": 2, "I": 1, "W": 1}]}')
    done = pipeforge(["simulate", "1f1b", "-D", "P=2", "-D", "M=2", "--costs", "c.json", "--json"], tmp_path)
    assert done.returncode == 0 and b'"makespan": 12.0' in done.stdout, done.stderr  # F = 2: 9 with unit costs


def test_a_pipe_file_with_a_byte_order_mark_is_the_same_output_when_it_defines_the_same_schedules(tmp_path):
    (tmp_path / "t.pipe").write_bytes(BOM + program().encode())
    done = pipeforge(["fmt", "t.pipe", "-o", "out.pipe"], tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "out.pipe").write_bytes(BOM + program().encode())  # the user's editor saved it again
    done = pipeforge(["fmt", "t.pipe", "-o", "out.pipe"], tmp_path)
    assert done.returncode == 0, done.stderr
