"""A package's methods (SPEC §2c) as ``m.methods``: a read-only mapping from name to a callable model.

Each method is the loader's ordinary model class (Model on the CPU, CudaModel on the GPU) over the method's view
of the manifest (``Manifest.method``: its own symbols, guards, inputs and outputs), so guards, workspaces, CUDA
graphs and conversions work as for any package; what they share is made once: the CPU weights are one set of
arrays (one mapping of the archive) and the one kernel library, each method calling its own entry point; on the
GPU the weights are uploaded once. With state, every method reads and updates one set of arrays per session, by
name: ``m.methods[name]`` runs against the model's default session, ``session.methods[name]`` against that one.

A package without methods has one: ``m.methods["forward"]`` is the model itself, so code written against methods
runs any package. ``m(...)`` on a package with methods runs its ``forward`` method; a package whose methods do not
include one says which it has.
"""

from __future__ import annotations

from tcexport.formats.errors import TcError

from .method_table import Method, Methods
from .state import Session, StatefulModel, initial_state, place


class MethodsModel:
    """A loaded package with methods: ``methods`` (name -> callable), ``m(...)`` the ``forward`` method. ``models``:
    name -> each method's model (Model, CudaModel, or StatefulModel over one of them sharing ``owner``'s state)."""

    def __init__(self, archive, models: dict):
        self.archive = archive
        self.manifest = archive.manifest
        self._models = models
        self._methods = Methods({name: Method(name, m) for name, m in models.items()}, self.manifest.model)

    @property
    def path(self):
        return self.archive.path

    @property
    def methods(self) -> Methods:
        return self._methods

    def __call__(self, *args, **kwargs):
        if "forward" not in self._models:
            raise TcError(f"package {self.manifest.model!r} has methods {list(self._models)} and no 'forward': call "
                          f"one of them, m.methods[name](...)")
        return self._methods["forward"](*args, **kwargs)

    @property
    def inputs(self) -> list:
        return self._forward("inputs")

    @property
    def outputs(self) -> list:
        return self._forward("outputs")

    def _forward(self, attr: str) -> list:
        """The ``forward`` method's ``attr``; a package without one has none (a call says which methods it has)."""
        return getattr(self._models["forward"], attr) if "forward" in self._models else []

    def close(self) -> None:
        """Close every method's model, the one owning the shared device weights last."""
        for m in reversed(list(self._models.values())):
            if hasattr(m, "close"):
                m.close()

    def __repr__(self) -> str:
        return f"MethodsModel({self.manifest.model!r}, methods={list(self._models)})"


class StatefulMethods(MethodsModel):
    """A package with methods and state: one state by name for every method, one set of arrays per session.
    ``state()``, ``reset_state()`` and ``new_session()`` as on a StatefulModel; ``session.methods[name]``."""

    def __init__(self, archive, bases: dict):
        self._initial, self._specs = {}, {}
        for base in bases.values():
            m = base.manifest
            self._initial.update({k: v for k, v in initial_state(archive, m).items() if k not in self._initial})
            self._specs.update({s.name: m.inputs[s.input] for s in m.state})
        first = next(iter(bases.values()))
        self._device = first.device if hasattr(first, "device") else None
        models = {name: StatefulModel(base, owner=self) for name, base in bases.items()}
        super().__init__(archive, models)
        self._default = Session(self)
        self._methods = self._session_methods(self._default)

    def _fresh(self) -> dict:
        return {name: self._place(name) for name in self._initial}

    def _place(self, name: str):
        return place(self._initial[name], self._specs[name], self._device)

    def _session_methods(self, session: Session) -> Methods:
        return Methods({name: Method(name, m, _OnSession(m, session)) for name, m in self._models.items()},
                       self.manifest.model)

    def _step(self, session: Session, args: tuple, kwargs: dict):
        """A session's own call (``session(...)``): the ``forward`` method, as ``m(...)``."""
        if "forward" not in self._models:
            return self(*args, **kwargs)  # the error naming the methods
        return self._models["forward"]._step(session, args, kwargs)  # the session's lock is held already

    @property
    def state_specs(self) -> list:
        return list(self._specs.values())

    def state(self) -> dict:
        return self._default.state()

    def reset_state(self) -> None:
        self._default.reset_state()

    def new_session(self) -> Session:
        """A new state, from the package's initial values, that every method reads and updates
        (``session.methods[name](...)``)."""
        return Session(self)

    def __repr__(self) -> str:
        return f"StatefulMethods({self.manifest.model!r}, methods={list(self._models)}, state={list(self._specs)})"


class _OnSession:
    """A stateful method's call on one session (the session's lock held: its calls run one at a time)."""

    def __init__(self, model: StatefulModel, session: Session):
        self._model, self._session = model, session

    def __call__(self, *args, **kwargs):
        return self._session.run(self._model, args, kwargs)


def method_models(archive, make) -> dict:
    """name -> ``make(name, view)`` for every method of the package, in manifest order (the first first)."""
    m = archive.manifest
    return {name: make(name, m.method(name)) for name in m.method_names()}


def wrap(archive, models: dict):
    """The loaded package: StatefulMethods when a method has state, else MethodsModel."""
    if any(x.state for x in archive.manifest.methods):
        return StatefulMethods(archive, models)
    return MethodsModel(archive, models)
