"""Kubernetes quantities parse exactly, round up to canonical ints, and resource vectors do exact arithmetic."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest

from mcad.api.resources import ZERO, ResourceVector, format_amount, parse_quantity, to_canonical


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("2G", Fraction(2 * 10**9)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("1e3", Fraction(1000)),
        ("12E2", Fraction(1200)),
        ("1.5e-3", Fraction(15, 10**4)),
        ("2e+2", Fraction(200)),
        ("0.5", Fraction(1, 2)),
        ("100Mi", Fraction(100 * 2**20)),
        ("1Ki", Fraction(1024)),
        ("1Ti", Fraction(2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("-1", Fraction(-1)),
        ("+7", Fraction(7)),
        ("-250m", Fraction(-1, 4)),
        ("0", Fraction(0)),
        ("007", Fraction(7)),
        ("3n", Fraction(3, 10**9)),
        ("3u", Fraction(3, 10**6)),
        ("2k", Fraction(2000)),
        ("4M", Fraction(4 * 10**6)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),  # a lone E is the exa suffix, not an exponent
        (".5", Fraction(1, 2)),  # Kubernetes accepts a missing whole part ...
        ("1.", Fraction(1)),  # ... and a missing fraction
        ("0.1", Fraction(1, 10)),
        (3, Fraction(3)),
        (0.1, Fraction(1, 10)),  # a YAML float keeps its decimal meaning, not its binary approximation
        (2.5, Fraction(5, 2)),
    ],
)
def test_parse_quantity(text: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "1K", "1kb", "1 Gi", " 1", "1 ", "1.2.3", "--1", "+-1", "e3", "1e", "1e1.5", "1Gii", "0x10",
     "1,5", ".", "-", "1mi", "\uff11", "1e101", "nan", "inf"],
)
def test_parse_quantity_rejects_garbage_and_names_it(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity") as err:
        parse_quantity(bad)
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize("bad", [True, None, [1], {"a": 1}, float("nan"), float("inf")])
def test_parse_quantity_rejects_non_quantities(bad: object) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(bad)  # type: ignore[arg-type]


def test_parse_quantity_rejects_absurdly_long_numbers() -> None:
    with pytest.raises(ValueError, match="too many digits"):
        parse_quantity("9" * 10_000)


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        ("cpu", "500m", 500),
        ("cpu", "2", 2000),
        ("cpu", 2, 2000),
        ("cpu", 0.5, 500),
        ("cpu", "0.0001", 1),  # Kubernetes rounds cpu up to the milli: a request is never under-counted
        ("cpu", "1n", 1),
        ("cpu", "1500001u", 1501),
        ("cpu", "-0.0001", -1),  # away from zero, as Kubernetes rounds
        ("memory", "1.5Gi", 3 * 2**29),
        ("memory", "2G", 2 * 10**9),
        ("memory", "100m", 1),  # 0.1 byte rounds up to one byte
        ("memory", "1e3", 1000),
        ("nvidia.com/gpu", 1, 1),
        ("nvidia.com/gpu", "2", 2),
        ("pods", "110", 110),
        ("example.com/foo", "3", 3),
        ("ephemeral-storage", "1Ki", 1024),
    ],
)
def test_to_canonical(resource: str, value: str | int | float, expected: int) -> None:
    assert to_canonical(resource, value) == expected
    assert to_canonical(resource, value) == expected  # second call is served by the cache, same answer


def test_to_canonical_rejects_bool_even_though_1_is_cached() -> None:
    assert to_canonical("cpu", 1) == 1000
    with pytest.raises(ValueError, match="invalid quantity True"):
        to_canonical("cpu", True)


def v(**amounts: int) -> ResourceVector:
    """Vectors in tests: keyword names, with gpu meaning nvidia.com/gpu."""
    return ResourceVector({("nvidia.com/gpu" if k == "gpu" else k): a for k, a in amounts.items()})


def test_vector_drops_zero_entries_and_compares_by_value() -> None:
    vec = ResourceVector({"cpu": 1000, "memory": 0, "gpu": 0})
    assert dict(vec.items()) == {"cpu": 1000}
    assert len(vec) == 1
    assert "memory" not in vec
    assert vec == ResourceVector({"cpu": 1000})
    assert vec == {"cpu": 1000}
    assert vec != ResourceVector({"cpu": 999})
    assert hash(vec) == hash(ResourceVector({"cpu": 1000}))
    assert len({vec, ResourceVector({"cpu": 1000}), ZERO}) == 2


def test_vector_is_immutable_and_slotted() -> None:
    vec = v(cpu=1)
    with pytest.raises(AttributeError):
        setattr(vec, "_d", {})  # noqa: B010 - the point is to try
    with pytest.raises(AttributeError):
        setattr(vec, "extra", 1)  # noqa: B010
    assert not hasattr(vec, "__dict__")
    assert pickle.loads(pickle.dumps(vec)) == vec


def test_vector_rejects_non_int_amounts() -> None:
    with pytest.raises(TypeError, match="cpu"):
        ResourceVector({"cpu": 1.5})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ResourceVector({"cpu": True})
    with pytest.raises(TypeError):
        ResourceVector({1: 1})  # type: ignore[arg-type]


def test_vector_read_access() -> None:
    vec = v(cpu=1500, memory=10)
    assert vec.get("cpu") == 1500
    assert vec.get("nvidia.com/gpu") == 0
    assert vec.get("nvidia.com/gpu", -1) == -1
    assert vec["memory"] == 10
    assert vec["pods"] == 0
    assert sorted(vec) == ["cpu", "memory"]
    assert sorted(vec.keys()) == ["cpu", "memory"]
    assert sorted(vec.values()) == [10, 1500]
    copy = vec.as_dict()
    copy["cpu"] = 0
    assert vec["cpu"] == 1500
    assert bool(vec) and not bool(ZERO)
    assert ResourceVector.of("cpu", 5) == v(cpu=5)
    assert ResourceVector.of("cpu", 0) == ZERO
    assert ResourceVector(vec) == vec
    assert ResourceVector([("cpu", 2), ("memory", 0)]) == v(cpu=2)


@pytest.mark.parametrize(
    ("a", "b", "total", "difference"),
    [
        (v(cpu=1000, memory=5), v(cpu=500), v(cpu=1500, memory=5), v(cpu=500, memory=5)),
        (v(cpu=1000), v(cpu=1000), v(cpu=2000), ZERO),  # an exact zero disappears
        (v(cpu=1000), v(memory=7), v(cpu=1000, memory=7), v(cpu=1000, memory=-7)),  # may go negative
        (ZERO, v(gpu=2), v(gpu=2), v(gpu=-2)),
        (v(gpu=2), ZERO, v(gpu=2), v(gpu=2)),
        (v(cpu=-5), v(cpu=5), ZERO, v(cpu=-10)),
    ],
)
def test_vector_add_and_sub(a: ResourceVector, b: ResourceVector, total: ResourceVector,
                            difference: ResourceVector) -> None:
    assert a + b == total
    assert b + a == total
    assert a - b == difference
    assert (a - b) + b == a
    assert -(a - b) == b - a


def test_vector_arithmetic_leaves_operands_alone() -> None:
    a, b = v(cpu=1, memory=2), v(cpu=3)
    _ = a + b, a - b, a.scale(3), a.max(b), (a - b).clamp()
    assert a == v(cpu=1, memory=2) and b == v(cpu=3)


def test_vector_refuses_to_add_a_dict() -> None:
    with pytest.raises(TypeError):
        _ = v(cpu=1) + {"cpu": 1}  # type: ignore[operator]


@pytest.mark.parametrize(
    ("vec", "n", "expected"),
    [(v(cpu=1500, gpu=1), 4, v(cpu=6000, gpu=4)), (v(cpu=1500), 1, v(cpu=1500)), (v(cpu=1500), 0, ZERO)],
)
def test_vector_scale(vec: ResourceVector, n: int, expected: ResourceVector) -> None:
    assert vec.scale(n) == expected


@pytest.mark.parametrize(
    ("vec", "expected"),
    [(v(cpu=-1, memory=5), v(memory=5)), (v(cpu=3), v(cpu=3)), (v(cpu=-3), ZERO), (ZERO, ZERO)],
)
def test_vector_clamp(vec: ResourceVector, expected: ResourceVector) -> None:
    assert vec.clamp() == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (v(cpu=1000, memory=10), v(cpu=500, memory=20), v(cpu=1000, memory=20)),
        (v(cpu=1000), v(gpu=1), v(cpu=1000, gpu=1)),
        (v(cpu=-5), ZERO, ZERO),  # missing counts as 0
        (v(cpu=-5), v(cpu=-9), v(cpu=-5)),
        (ZERO, v(cpu=-1, memory=1), v(memory=1)),
    ],
)
def test_vector_max(a: ResourceVector, b: ResourceVector, expected: ResourceVector) -> None:
    assert a.max(b) == expected
    assert b.max(a) == expected


@pytest.mark.parametrize(
    ("demand", "available", "short"),
    [
        (v(cpu=1000), v(cpu=1000), ZERO),
        (v(cpu=1000), v(cpu=2000, memory=1), ZERO),
        (v(cpu=3000, memory=10), v(cpu=1000, memory=10), v(cpu=2000)),
        (v(gpu=1), v(cpu=64000), v(gpu=1)),  # missing in available = 0
        (v(cpu=1000), v(cpu=-500), v(cpu=1500)),  # over-committed free capacity
        (ZERO, v(cpu=-500), ZERO),  # a demand without cpu fits even when cpu is over-committed
        (v(memory=5, gpu=2), v(memory=4, gpu=1), v(memory=1, gpu=1)),
    ],
)
def test_vector_fits_in_and_shortfall(demand: ResourceVector, available: ResourceVector,
                                      short: ResourceVector) -> None:
    assert demand.shortfall(available) == short
    assert demand.fits_in(available) is (not short)


@pytest.mark.parametrize(
    ("vec", "text"),
    [
        (v(cpu=1500, memory=2 * 2**30, gpu=1), "cpu=1500m memory=2Gi nvidia.com/gpu=1"),
        (v(cpu=2000), "cpu=2"),
        (v(cpu=1), "cpu=1m"),
        (v(memory=2 * 10**9), "memory=2G"),  # shortest exact form: 2G, not 1953125Ki
        (v(memory=3 * 2**29), "memory=1536Mi"),
        (v(memory=1000), "memory=1k"),
        (v(memory=1500), "memory=1500"),
        (v(memory=1024), "memory=1Ki"),
        (v(memory=-2 * 2**30), "memory=-2Gi"),
        (v(cpu=-1500), "cpu=-1500m"),
        (ResourceVector({"example.com/foo": 3, "memory": 1, "cpu": 1000, "ephemeral-storage": 2**20}),
         "cpu=1 memory=1 ephemeral-storage=1Mi example.com/foo=3"),
        (ResourceVector({"hugepages-2Mi": 4 * 2**20}), "hugepages-2Mi=4Mi"),
        (ZERO, ""),
    ],
)
def test_vector_format(vec: ResourceVector, text: str) -> None:
    assert vec.format() == text
    assert str(vec) == text


def test_vector_format_value_and_format_amount() -> None:
    vec = v(cpu=2500, memory=2**30)
    assert vec.format_value("cpu") == "2500m"
    assert vec.format_value("memory") == "1Gi"
    assert vec.format_value("nvidia.com/gpu") == "0"
    assert format_amount("cpu", 3000) == "3"


@pytest.mark.parametrize(
    ("quantities", "expected"),
    [
        ({"cpu": "1500m", "memory": "2Gi", "nvidia.com/gpu": 1}, v(cpu=1500, memory=2 * 2**30, gpu=1)),
        ({"cpu": 0, "memory": "0"}, ZERO),
        ({}, ZERO),
    ],
)
def test_vector_from_quantities(quantities: dict[str, str | int], expected: ResourceVector) -> None:
    assert ResourceVector.from_quantities(quantities) == expected


def test_vector_from_quantities_names_the_bad_entry() -> None:
    with pytest.raises(ValueError, match=r"^memory: invalid quantity '2 GB'"):
        ResourceVector.from_quantities({"cpu": "1", "memory": "2 GB"})


@pytest.mark.parametrize("text", ["0", "1", "1500m", "2Gi", "2G", "1536Mi", "1500", "-3Ki", "999999999999"])
def test_format_round_trips_through_parse(text: str) -> None:
    for resource in ("cpu", "memory"):
        amount = to_canonical(resource, text)
        assert to_canonical(resource, format_amount(resource, amount)) == amount


def test_the_hash_is_kept_once_asked_and_equal_vectors_still_hash_alike() -> None:
    import pickle

    a = ResourceVector({"cpu": 1000, "nvidia.com/gpu": 1})
    first = hash(a)
    assert hash(a) == first == hash(ResourceVector({"nvidia.com/gpu": 1, "cpu": 1000}))
    assert hash(pickle.loads(pickle.dumps(a))) == first
    assert {a: "group"}[ResourceVector({"nvidia.com/gpu": 1, "cpu": 1000})] == "group"
    with pytest.raises(AttributeError):
        a._h = 0  # type: ignore[misc]
