"""A package face whose heavy names load on first use: one module ``__getattr__`` for every package that needs one.

A package's ``__init__`` names what it exports in ``__all__``; the names whose modules are costly to import (torch, the
text front-end, discord.py, Ray) are listed here by module and imported on the first attribute lookup (PEP 562), so
that importing the package for a type or a constant stays cheap. Pyright reads them from the ``TYPE_CHECKING`` imports
beside the call.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(package: str, public: Iterable[str], lazy: Mapping[str, Iterable[str]]
              ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package that imports some of its names on first use.

    Parameters
    ----------
    package
        The package's ``__name__``; its module must already be in ``sys.modules`` (call this from its ``__init__``).
    public
        The package's ``__all__``, for ``dir()``.
    lazy
        Module -> the names it defines that the package exports, imported on first use. A name that is a submodule
        of the package itself (``engines.instruments`` for ``instruments``) is that module.

    Returns
    -------
    (__getattr__, __dir__)
        To assign at the package's top level. A name found once is stored in the package, so later lookups are plain.
    """
    namespace = sys.modules[package].__dict__
    owner = {name: module for module, names in lazy.items() for name in names}
    listed = sorted(set(public))

    def __getattr__(name: str) -> Any:
        module_name = owner.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(listed))

    return __getattr__, __dir__
