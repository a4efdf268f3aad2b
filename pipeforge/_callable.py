"""Public functions that share their name with a submodule.

``pipeforge.verify(schedule)`` is a function of the public face, and
``pipeforge.verify`` is also a subpackage. Importing a submodule rebinds the
package attribute to the module, which would turn ``pipeforge.verify(...)`` into
"'module' object is not callable". Such a submodule calls ``make_callable`` on
itself: the module stays a module (``pipeforge.verify.Report`` works) and calling
it calls its function of the same name.
"""

from __future__ import annotations

import sys
import types


class CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def make_callable(module_name: str) -> None:
    sys.modules[module_name].__class__ = CallableModule
