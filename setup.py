"""Ship the top-level grammar/ and templates/ inside the wheel.

The design keeps the lark grammar and the jinja2 templates at the top of the
repository; a plain package-data rule cannot reach outside ``pipeforge/``, so
``build_py`` copies them into ``pipeforge/grammar`` and ``pipeforge/templates``
of the build tree. Editable installs find them at the top level instead
(``pipeforge.resources``).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
SHIPPED = {"grammar": "*.lark", "templates": "*.j2"}


class BuildWithResources(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for folder, pattern in SHIPPED.items():
            target = Path(self.build_lib) / "pipeforge" / folder
            target.mkdir(parents=True, exist_ok=True)
            for source in sorted((ROOT / folder).glob(pattern)):
                shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildWithResources})
