"""A call's inputs by position and by name, in the order a graph takes them (one rule for every model class)."""

from __future__ import annotations

from tcexport.formats.errors import ArityError


def gather(model: str, names: tuple, args: tuple, kwargs: dict) -> list:
    """Positional then keyword inputs, in ``names``' order; unknown, repeated or missing names are ArityErrors."""
    if not kwargs and len(args) == len(names):
        return list(args)
    if len(args) > len(names):
        raise ArityError(f"model {model!r} takes {len(names)} input(s) ({', '.join(names)}), got {len(args)} "
                         f"positional. Pass exactly these inputs.", expected=len(names), got=len(args), rule="arity")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise ArityError(f"model {model!r} has no input named {key!r}; inputs: {', '.join(names)}.",
                             input=key, expected=list(names), got=key, rule="arity")
        if key in values:
            raise ArityError(f"input {key!r} was passed both positionally and by name; pass it once.", input=key,
                             rule="arity")
        values[key] = value
    missing = [n for n in names if n not in values]
    if missing:
        raise ArityError(f"model {model!r} is missing input(s) {', '.join(missing)}; it takes {', '.join(names)}.",
                         input=missing[0], expected=list(names), got=sorted(values), rule="arity")
    return [values[n] for n in names]
