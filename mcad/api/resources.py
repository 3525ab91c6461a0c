"""Kubernetes resource quantities and the integer resource vectors the dispatcher does its arithmetic on.

Contract:
- ``parse_quantity`` parses a Kubernetes quantity (``"500m"``, ``"1.5Gi"``, ``"12E2"``, ``2``, ``0.5``) exactly into a
  ``Fraction``; anything else raises ``ValueError`` naming the value. The grammar is Kubernetes' own:
  ``[+-]<digits>[.<digits>]`` then one of the decimal suffixes ``n u m "" k M G T P E``, the binary suffixes
  ``Ki Mi Gi Ti Pi Ei``, or a decimal exponent ``e<int>`` / ``E<int>`` (``1E`` alone is exa, ``1E3`` is 1000).
- ``to_canonical`` turns a quantity into the integer the ledger counts in: millicores for ``cpu``, the base unit for
  everything else (bytes for memory and storage, a count for GPUs, pods and other extended resources). Fractions
  are rounded away from zero, as Kubernetes does (``0.0001`` cpu is 1 millicore; a request is never under-counted).
- ``ResourceVector`` is an immutable, hashable mapping resource name -> int with zero entries dropped, so two
  vectors are equal exactly when they hold the same non-zero amounts. Arithmetic treats a missing name as 0;
  ``__sub__`` may go negative (the ledger's free capacity can be over-committed), ``clamp`` drops negatives.

Vectors are small (a handful of names) and the dispatcher combines them thousands of times per second, so the
operations work on the underlying dict directly and return ``self``/``other`` unchanged when one side is empty.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from fractions import Fraction
from functools import lru_cache
from typing import Any, Final

Quantity = str | int | float

_DECIMAL_SUFFIXES: Final[dict[str, Fraction]] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_BINARY_SUFFIXES: Final[dict[str, int]] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIXES: Final[dict[str, Fraction]] = {
    **_DECIMAL_SUFFIXES,
    **{suffix: Fraction(1 << bits) for suffix, bits in _BINARY_SUFFIXES.items()},
}
# One leading sign, then digits with an optional fraction (Kubernetes accepts "1." and ".5"), then the suffix.
_NUMBER: Final = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?(.*)", re.ASCII | re.DOTALL)
_EXPONENT: Final = re.compile(r"[eE]([+-]?\d+)", re.ASCII)
# Kubernetes caps quantities at int64 anyway; the bound only stops "1e999999999" from building a huge integer.
_MAX_EXPONENT: Final = 100
# Names whose canonical unit is the byte: formatted with a binary or decimal suffix.
_BYTE_RESOURCES: Final = frozenset({"memory", "ephemeral-storage", "storage"})


def parse_quantity(value: Quantity) -> Fraction:
    """The exact value of a Kubernetes quantity; ``ValueError`` naming the value when it is not one."""
    if isinstance(value, bool):  # bool is an int subclass; `cpu: true` is a mistake, not 1 core
        raise ValueError(f"invalid quantity {value!r}: not a number")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"invalid quantity {value!r}: not a finite number")
        # repr gives the shortest decimal that round-trips, i.e. what the YAML said (0.1, not 0.1000000000000000055).
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise ValueError(f"invalid quantity {value!r}: expected a string or a number")
    match = _NUMBER.fullmatch(value)
    if match is None:  # pragma: no cover - the pattern matches every string; kept for the type checker
        raise ValueError(f"invalid quantity {value!r}")
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    if not whole and not fraction:
        raise ValueError(f"invalid quantity {value!r}: no digits")
    multiplier = _SUFFIXES.get(suffix)
    if multiplier is None:
        exponent = _EXPONENT.fullmatch(suffix)
        if exponent is None:
            raise ValueError(f"invalid quantity {value!r}: unknown suffix {suffix!r}")
        power = int(exponent.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise ValueError(f"invalid quantity {value!r}: exponent out of range")
        multiplier = Fraction(10) ** power
    try:
        mantissa = Fraction(int(whole + fraction), 10 ** len(fraction))
    except ValueError:  # more digits than int() converts (sys.int_info.str_digits_check_threshold)
        raise ValueError(f"invalid quantity {value[:40]!r}...: too many digits") from None
    result = mantissa * multiplier
    return -result if sign == "-" else result


def to_canonical(resource: str, value: Quantity) -> int:
    """``value`` of ``resource`` as an integer: millicores for cpu, the base unit otherwise, rounded away from zero."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid quantity {value!r}: expected a string or a number")
    return _canonical(resource == "cpu", value)


# Pods and nodes repeat a few quantities ("500m", "1Gi") endlessly; caching makes the informer transforms cheap.
# typed=True keeps 1 and 1.0 apart (same result, but it also keeps the cache honest about what it saw).
@lru_cache(maxsize=8192, typed=True)
def _canonical(milli: bool, value: Quantity) -> int:
    exact = parse_quantity(value)
    if milli:
        exact *= 1000
    # Away from zero, as Kubernetes' Quantity.MilliValue/Value do.
    return math.ceil(exact) if exact >= 0 else -math.ceil(-exact)


def canonical_entries(quantities: Mapping[Any, Any]) -> Iterator[tuple[str, Any, int]]:
    """``(name, value, to_canonical(name, value))`` for each entry that is a quantity; entries whose name is not a
    string or whose value does not parse are skipped (for objects the API server validated already, or whose bad
    values another check reports)."""
    for name, value in quantities.items():
        if not isinstance(name, str):
            continue
        try:
            amount = to_canonical(name, value)
        except ValueError:
            continue
        yield name, value, amount


def shared(vector: ResourceVector) -> ResourceVector:
    """The one kept copy of a vector equal to ``vector``. For vectors kept long, by thousands: the demands and pod
    requests of queued AppWrappers take few distinct values, so sharing them saves most of their memory. Bounded
    (the least recently used drop out)."""
    return _shared(vector)


class ResourceVector:
    """Immutable mapping resource name -> int (millicores for cpu, base units otherwise); zero entries are dropped."""

    # _h: the hash, once asked for. Vectors are pending groups' keys (mcad.model.pending): a snapshot of a queue of
    # 100,000 looks its group up for each member, and hashing a frozenset of the items each time was most of it.
    __slots__ = ("_d", "_h")
    _d: dict[str, int]
    _h: int

    def __init__(self, values: ResourceVector | Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        pairs = values.items() if isinstance(values, ResourceVector | Mapping) else values
        d: dict[str, int] = {}
        for name, amount in pairs:
            if not isinstance(name, str):
                raise TypeError(f"resource name must be a string, got {name!r}")
            if isinstance(amount, bool) or not isinstance(amount, int):
                raise TypeError(f"amount of {name} must be an int, got {amount!r}")
            if amount:
                d[name] = amount
        object.__setattr__(self, "_d", d)

    @classmethod
    def from_quantities(cls, quantities: Mapping[str, Quantity]) -> ResourceVector:
        """Parse a Kubernetes ResourceList (``{"cpu": "500m", "memory": "1Gi"}``); ``ValueError`` names the entry."""
        d: dict[str, int] = {}
        for name, value in quantities.items():
            try:
                amount = to_canonical(name, value)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
            if amount:
                d[name] = amount
        return _make(d)

    @classmethod
    def of(cls, name: str, amount: int) -> ResourceVector:
        """A vector with one entry (empty when ``amount`` is 0)."""
        return cls({name: amount})

    # -- immutability and value semantics -------------------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ResourceVector is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ResourceVector is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (ResourceVector, (self._d,))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResourceVector):
            return self._d == other._d
        if isinstance(other, Mapping):  # lets tests and callers compare with a plain dict
            return self._d == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        try:
            return self._h
        except AttributeError:
            value = hash(frozenset(self._d.items()))
            object.__setattr__(self, "_h", value)
            return value

    def __repr__(self) -> str:
        return f"ResourceVector({self._d!r})"

    def __str__(self) -> str:
        return self.format()

    # -- read access ----------------------------------------------------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __contains__(self, name: object) -> bool:
        return name in self._d

    def __getitem__(self, name: str) -> int:
        return self._d.get(name, 0)

    def get(self, name: str, default: int = 0) -> int:
        return self._d.get(name, default)

    def items(self) -> ItemsView[str, int]:
        return self._d.items()

    def keys(self) -> KeysView[str]:
        return self._d.keys()

    def values(self) -> ValuesView[int]:
        return self._d.values()

    def as_dict(self) -> dict[str, int]:
        """A fresh, mutable copy."""
        return dict(self._d)

    # -- arithmetic -----------------------------------------------------------------------------------------------

    def __add__(self, other: ResourceVector) -> ResourceVector:
        if not isinstance(other, ResourceVector):
            return NotImplemented
        od = other._d
        if not od:
            return self
        if not self._d:
            return other
        d = self._d.copy()
        for name, amount in od.items():
            total = d.get(name, 0) + amount
            if total:
                d[name] = total
            else:  # amount != 0, so a zero total means the name was present
                del d[name]
        return _make(d)

    def __sub__(self, other: ResourceVector) -> ResourceVector:
        if not isinstance(other, ResourceVector):
            return NotImplemented
        od = other._d
        if not od:
            return self
        d = self._d.copy()
        for name, amount in od.items():
            total = d.get(name, 0) - amount
            if total:
                d[name] = total
            else:
                del d[name]
        return _make(d)

    def __neg__(self) -> ResourceVector:
        return _make({name: -amount for name, amount in self._d.items()})

    def scale(self, n: int) -> ResourceVector:
        """Every amount times ``n`` (``n`` replicas of one pod)."""
        if n == 1:
            return self
        if n == 0:
            return ZERO
        return _make({name: amount * n for name, amount in self._d.items()})

    def clamp(self) -> ResourceVector:
        """The same vector without its negative entries."""
        d = self._d
        for amount in d.values():
            if amount < 0:
                return _make({name: a for name, a in d.items() if a > 0})
        return self

    def max(self, other: ResourceVector) -> ResourceVector:
        """Elementwise maximum, a missing name counting as 0."""
        sd, od = self._d, other._d
        d: dict[str, int] = {}
        for name, mine in sd.items():
            theirs = od.get(name, 0)
            larger = mine if mine > theirs else theirs
            if larger:
                d[name] = larger
        for name, theirs in od.items():
            if theirs > 0 and name not in sd:
                d[name] = theirs
        return _make(d)

    def fits_in(self, available: ResourceVector) -> bool:
        """True when every amount of self is <= the same resource in ``available`` (missing = 0)."""
        ad = available._d
        return all(amount <= ad.get(name, 0) for name, amount in self._d.items())

    def shortfall(self, available: ResourceVector) -> ResourceVector:
        """Per resource, how much self exceeds ``available``; empty exactly when ``fits_in(available)``."""
        ad = available._d
        d: dict[str, int] = {}
        for name, amount in self._d.items():
            have = ad.get(name, 0)
            if amount > have:
                d[name] = amount - have
        return _make(d)

    # -- presentation ---------------------------------------------------------------------------------------------

    def format(self) -> str:
        """Human-readable, e.g. ``cpu=1500m memory=2Gi nvidia.com/gpu=1``: cpu and memory first, then by name.

        cpu shows whole cores without a suffix and millicores otherwise; byte resources use the shortest exact
        suffixed form (binary preferred on ties, so 2Gi stays 2Gi and 2G stays 2G); the rest are plain counts.
        Every number shown is exact. The empty vector formats as ``""``.
        """
        names = sorted(self._d, key=lambda n: (n != "cpu", n != "memory", n))
        return " ".join(f"{name}={format_amount(name, self._d[name])}" for name in names)

    def format_value(self, name: str) -> str:
        """The amount of one resource formatted as in ``format`` (``"0"`` when absent)."""
        return format_amount(name, self._d.get(name, 0))


def format_amount(resource: str, amount: int) -> str:
    """One canonical amount as a Kubernetes quantity string (see ``ResourceVector.format``)."""
    if resource == "cpu":
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if resource in _BYTE_RESOURCES or resource.startswith("hugepages-"):
        return _format_bytes(amount)
    return str(amount)


def _format_bytes(amount: int) -> str:
    sign, n = ("-", -amount) if amount < 0 else ("", amount)
    if n == 0:
        return "0"
    binary = decimal = str(n)
    for suffix, bits in reversed(_BINARY_SUFFIXES.items()):
        if n & ((1 << bits) - 1) == 0:
            binary = f"{n >> bits}{suffix}"
            break
    for suffix, power in (("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)):
        if n % 10**power == 0:
            decimal = f"{n // 10**power}{suffix}"
            break
    return sign + (binary if len(binary) <= len(decimal) else decimal)


def _make(d: dict[str, int]) -> ResourceVector:
    """Wrap an already-clean dict (no zero entries, owned by the new vector) without re-validating it."""
    vector = object.__new__(ResourceVector)
    object.__setattr__(vector, "_d", d)
    return vector


ZERO: Final = ResourceVector()


@functools.lru_cache(maxsize=4096)
def _shared(vector: ResourceVector) -> ResourceVector:
    return vector
