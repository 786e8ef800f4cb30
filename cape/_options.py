"""Option objects given field by field: a frozen dataclass updated by keyword overrides, unknown names refused."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

from ._errors import CapeInputError

T = TypeVar("T")


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of the dataclass ``cls``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls))


def with_options(cls: type[T], config: T | None, options: Mapping[str, Any], where: str) -> T:
    """``config`` (default: ``cls()``) with the fields named in ``options`` replaced.

    Parameters
    ----------
    cls
        The option class (a frozen dataclass that validates itself in ``__post_init__``).
    config
        The starting options, or None for the defaults.
    options
        Field values by name; a name that is no field of ``cls`` raises :class:`~cape.CapeInputError`.
    where
        The function the options were given to, for the error message.

    Returns
    -------
    The updated (and so validated) option object.
    """
    if config is not None and not isinstance(config, cls):
        raise CapeInputError(f"{where}: config must be a {cls.__name__}, got {type(config).__name__}")
    names = field_names(cls)
    unknown = [name for name in options if name not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CapeInputError(f"{where}: unknown option {unknown[0]!r}{hint}; {cls.__name__} has "
                             f"{', '.join(names)}")
    base = cls() if config is None else config
    return dataclasses.replace(base, **options) if options else base
