"""Faster construction of frozen, slotted dataclasses built on the hot path.

A frozen dataclass's generated ``__init__`` sets each field with
``object.__setattr__(self, name, value)``: a generic attribute lookup by name
per field, about 0.2 µs each. The core builds several such records per message
(events, journal changes, datagrams), so that is several microseconds of every
send and delivery. :func:`fast_init` replaces the ``__init__`` of such classes
with one that stores each field through its slot descriptor. The classes stay
what they are: frozen (assignment still raises ``FrozenInstanceError``),
slotted, with the same signature, defaults, equality, hashing and repr.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def fast_init(*classes: type[Any]) -> None:
    """Give each frozen, slotted dataclass of ``classes`` the faster ``__init__``.

    Only plain fields are supported (no ``default_factory``, ``kw_only``,
    ``init=False``, ``InitVar`` or ``__post_init__``): a class with any of them
    raises ``TypeError``, so a later change to a record cannot silently get a
    wrong constructor.
    """
    for cls in classes:
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not params.frozen or "__slots__" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
        if hasattr(cls, "__post_init__") or hasattr(cls, "__dataclass_init_vars__"):
            raise TypeError(f"{cls.__name__} has a __post_init__ or init-only variables")
        namespace: dict[str, Any] = {}
        params_src: list[str] = []
        body: list[str] = []
        for i, f in enumerate(dataclasses.fields(cls)):
            if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name} is not a plain field")
            if f.default is dataclasses.MISSING:
                params_src.append(f.name)
            else:
                namespace[f"_d{i}"] = f.default
                params_src.append(f"{f.name}=_d{i}")
            # The slot's descriptor (a base class's for an inherited field).
            namespace[f"_s{i}"] = getattr(cls, f.name).__set__
            body.append(f"    _s{i}(self, {f.name})")
        source = f"def __init__(self, {', '.join(params_src)}):\n" + ("\n".join(body) or "    pass")
        exec(source, namespace)  # built from field names only
        init = namespace["__init__"]
        generated = cls.__dict__["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        init.__annotations__ = dict(generated.__annotations__)
        init.__doc__ = generated.__doc__
        cls.__init__ = init
