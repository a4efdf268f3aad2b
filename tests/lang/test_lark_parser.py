"""The parser's tables kept between runs (``lang/lark_parser.py``): what is loaded parses as what is built,
a file of another grammar is never used, and a folder that cannot be written keeps nothing."""

from __future__ import annotations

import os

import pytest
from lark import UnexpectedInput

from pipeforge.lang import lark_parser
from pipeforge.lang.lark_parser import TooManyTokens, build_parser, cache_file
from pipeforge.library import source
from pipeforge.resources import grammar_file

GRAMMAR = grammar_file().read_text(encoding="utf-8")


def test_a_kept_parser_parses_as_a_built_one(tmp_path, monkeypatch):
    built = build_parser(GRAMMAR, None)
    written = build_parser(GRAMMAR, str(tmp_path))  # built, and its tables written
    assert os.listdir(tmp_path) == [os.path.basename(cache_file(GRAMMAR, str(tmp_path)))]  # no temporary left
    kept = os.stat(cache_file(GRAMMAR, str(tmp_path))).st_mtime_ns
    loaded = build_parser(GRAMMAR, str(tmp_path))
    assert os.stat(cache_file(GRAMMAR, str(tmp_path))).st_mtime_ns == kept  # loaded, not built and written again
    text = source("interleaved-zb")
    trees = [p.parse(text) for p in (built, written, loaded)]
    assert trees[0] == trees[1] == trees[2]
    assert [t.meta.line for t in trees[2].iter_subtrees()] == [t.meta.line for t in trees[0].iter_subtrees()]
    monkeypatch.setattr(lark_parser, "MAX_TOKENS", 10)  # the token budget rides along with the loaded tables
    with pytest.raises(TooManyTokens):
        loaded.parse(text)


def test_a_file_kept_for_another_grammar_is_never_used(tmp_path):
    other = GRAMMAR.replace('"schedule" NAME', '"plan" NAME', 1)
    build_parser(GRAMMAR, str(tmp_path))
    os.replace(cache_file(GRAMMAR, str(tmp_path)), cache_file(other, str(tmp_path)))  # at the other's name
    parser = build_parser(other, str(tmp_path))
    assert parser.parse(source("1f1b").replace("schedule ", "plan ", 1))
    with pytest.raises(UnexpectedInput):
        parser.parse(source("1f1b"))


def test_a_folder_that_cannot_be_written_keeps_nothing(tmp_path):
    (tmp_path / "file").write_text("")
    parser = build_parser(GRAMMAR, str(tmp_path / "file" / "cache"))
    assert parser.parse(source("1f1b")) and os.listdir(tmp_path) == ["file"]


def test_the_folder_is_the_users_cache(monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "/some/cache")
    assert lark_parser.cache_folder() == os.path.join("/some/cache", "pipeforge")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert lark_parser.cache_folder() is None
