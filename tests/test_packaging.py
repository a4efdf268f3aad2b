"""The package as ``python -m build`` makes it: an sdist, then a wheel built from that sdist.

Both carry the grammar, the templates and the library. The builds run setuptools'
PEP 517 hooks (what ``build`` calls) without isolation, in a copy of the checkout,
so the test needs no network and leaves nothing behind. The full check (a fresh
venv, the wheel installed, ``pipeforge verify/simulate/codegen`` run from outside
the repository) is ``scripts/check_package.sh``, run by CI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
                                    ".pytest_cache", "out", "tests", "benchmarks")

BUILD = """
import json, os, sys, tarfile, zipfile
from setuptools import build_meta
out = sys.argv[1]
sdist = build_meta.build_sdist(out)
with tarfile.open(os.path.join(out, sdist)) as archive:
    sdist_names = archive.getnames()
    archive.extractall(os.path.join(out, "unpacked"), filter="data")
os.chdir(os.path.join(out, "unpacked", sdist[: -len(".tar.gz")]))
wheel = build_meta.build_wheel(out)
with zipfile.ZipFile(os.path.join(out, wheel)) as archive:
    wheel_names = archive.namelist()
print(json.dumps({"sdist": sdist_names, "wheel": wheel_names}))
"""


def _build(tmp_path: Path) -> dict[str, list[str]]:
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SOURCE)
    out = tmp_path / "dist"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=checkout, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_sdist_and_the_wheel_built_from_it_carry_grammar_templates_and_library(tmp_path):
    names = _build(tmp_path)
    sdist = {name.split("/", 1)[1] for name in names["sdist"] if "/" in name}
    wheel = set(names["wheel"])
    shipped = [ROOT / "grammar" / "pipe.lark", *sorted((ROOT / "templates").glob("*.j2"))]
    library = sorted((ROOT / "pipeforge" / "library").glob("*.pipe"))
    assert library and len(shipped) >= 2
    for path in shipped:
        relative = path.relative_to(ROOT).as_posix()
        assert relative in sdist, f"the sdist lacks {relative}"
        assert f"pipeforge/{relative}" in wheel, f"the wheel built from the sdist lacks pipeforge/{relative}"
    for path in library:
        relative = path.relative_to(ROOT).as_posix()
        assert relative in sdist and relative in wheel, f"{relative} is not shipped"
    assert not any(name.startswith("tests/") for name in wheel)
