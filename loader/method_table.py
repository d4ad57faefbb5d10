"""``m.methods``: the read-only mapping from a package's method names to callables (loader/methods.py builds it for a
package with methods; every model class has one, ``forward`` alone, for a package without). Kept apart so the
model classes can offer it without importing the classes that run methods."""

from __future__ import annotations

from collections.abc import Mapping

from tcexport.formats.errors import GuardError, UnknownMethodError


class Methods(Mapping):
    """Name -> callable; ``m.methods[name]`` for a name the package lacks is an UnknownMethodError naming those it
    has."""

    def __init__(self, items: dict, model: str):
        self._items = dict(items)
        self._model = model

    def __getitem__(self, name):
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownMethodError(f"package {self._model!r} has no method {name!r}; its methods are "
                                     f"{list(self._items)}", name=name, methods=list(self._items)) from None

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Methods({list(self._items)})"


class Method:
    """One method of a loaded package: calls ``run`` (the method's model, or its model on a session) and names the
    method in a guard error; every other attribute (``inputs``, ``outputs``, ``symbols``, ``manifest``) is the
    method's model's."""

    def __init__(self, name: str, model, run=None):
        self.name = name
        self.model = model
        self._run = run if run is not None else model

    def __call__(self, *args, **kwargs):
        try:
            return self._run(*args, **kwargs)
        except GuardError as e:
            e.args = (f"method {self.name!r}: {e.args[0] if e.args else e}",) + e.args[1:]
            e.method = self.name
            raise

    def __getattr__(self, attr):
        return getattr(self.model, attr)

    def __repr__(self) -> str:
        return f"Method({self.name!r}, {self.model!r})"
