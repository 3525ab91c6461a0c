#!/usr/bin/env python3
"""Writes docs/reference/appwrapper.md, the AppWrapper API reference, from the CRD's schema and a hand-written table.

Contract (``python3 hack/gen-api-reference.py --help``; ``make api-reference``):
- ``fields(crd)`` walks the ``openAPIV3Schema`` of the CRD's served version (config/crd/workload.codeflare.dev_
  appwrappers.yaml; the chart's copy and the legacy group's CRD have the same schema, test/unit/test_legacy_crd.py)
  and lists every field path (``spec.resources.GenericItems[].completionstatus``: ``.`` into an object, ``[]`` into
  the items of an array), in schema order, each with its type, its bounds (required, minimum, maximum, maxLength,
  maxItems, enum, pattern, CEL rules with their messages), its default and its description. A map
  (``additionalProperties``) or an object that keeps unknown fields is one field: its keys are the user's.
- The table (hack/api-reference.yaml) says per field path what mcad does with it: ``use`` (``acts``: the
  controller or admission reads it; ``ignored``: accepted, stored and never read; ``writes``: a status field mcad
  writes; ``unwritten``: a status field mcad never writes) and ``does`` (prose). ``$NAME`` in the prose is the
  value of a constant of the code (``CONSTANTS``), so a number changed in the code changes the page. The table
  also holds what each annotation and label mcad reads or writes does; the annotations' defaults, floors and
  ceilings come from ``mcad.api.faulttolerance`` and ``mcad.cli.faultflags`` (the minimum run time's from
  ``mcad.api.minruntime``).
- ``problems(fields, table)`` names every CRD field without a row and every row naming a field the CRD lacks (and
  the same for the fault tolerance annotations of the code); the generator writes nothing while there is one.
- ``render(crd, table)`` is the page; ``--check`` compares it with the committed file instead of writing it (exit 1
  when they differ). test/unit/test_api_reference.py runs all three.
Needs PyYAML and mcad importable (the repository's .venv).
"""

from __future__ import annotations

import argparse
import string
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcad.admission import review  # noqa: E402
from mcad.api import appwrapper, faulttolerance, minruntime, validation, views  # noqa: E402
from mcad.cli import faultflags  # noqa: E402
from mcad.loop import active  # noqa: E402
from mcad.model import estimate, estimatetold, lifecycle, quota, status, tenancy  # noqa: E402

CRD = REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml"
TABLE = REPO / "hack" / "api-reference.yaml"
OUTPUT = REPO / "docs" / "reference" / "appwrapper.md"

USES = {
    "acts": "acted on",
    "ignored": "accepted, ignored",
    "writes": "written by mcad",
    "unwritten": "never written",
}

# The code's numbers the prose names as $NAME.
CONSTANTS: Mapping[str, object] = {
    "MAX_NAME_LENGTH": validation.MAX_NAME_LENGTH,
    "MAX_OBJECT_NAME_LENGTH": validation.MAX_OBJECT_NAME_LENGTH,
    "MAX_ITEMS": validation.MAX_ITEMS_CEILING,
    "DEFAULT_MAX_BYTES": f"{validation.DEFAULT_MAX_BYTES:,}",
    "MAX_NESTING_DEPTH": validation.MAX_NESTING_DEPTH,
    "MAX_REQUEUE_SECONDS": f"{validation.MAX_REQUEUE_SECONDS:,}",
    "MAX_DISPATCH_LIMIT_SECONDS": f"{validation.MAX_DISPATCH_LIMIT_SECONDS:,}",
    "DEFAULT_REQUEUE_SECONDS": appwrapper.DEFAULT_REQUEUE_SECONDS,
    "REQUEUES_AS_SPECIFIED": lifecycle.REQUEUES_AS_SPECIFIED,
    "REQUEUE_FLOOR_CAP_SECONDS": lifecycle.REQUEUE_FLOOR_CAP_SECONDS,
    "DEFAULT_MAX_PRIORITY": tenancy.DEFAULT_MAX_PRIORITY,
    "MAX_CONDITIONS": status.MAX_CONDITIONS,
    "MAX_PENDING_PODS": status.MAX_PENDING_PODS,
    "MAX_SCHEDULER_MESSAGE": views.MAX_SCHEDULER_MESSAGE,
    "MAX_RESETS_KEPT": status.MAX_RESETS_KEPT,
    "POD_COUNT_WINDOW_SECONDS": f"{active.POD_COUNT_WINDOW_SECONDS:g}",
    "IMMUTABLE_SCHEDULING": ", ".join(f"`{key}`" for key in review.IMMUTABLE_SCHEDULING),
    "APPWRAPPER_LABEL": appwrapper.APPWRAPPER_LABEL,
    "LEGACY_APPWRAPPER_LABEL": appwrapper.LEGACY_APPWRAPPER_LABEL,
    "APPWRAPPER_UID_LABEL": appwrapper.APPWRAPPER_UID_LABEL,
    "BINDING_PREFIX": quota.BINDING_PREFIX,
    "MAX_RETRY_LIMIT": faulttolerance.MAX_RETRY_LIMIT,
    "MAX_EXIT_CODES": faulttolerance.MAX_EXIT_CODES,
    "SHOWN_ANNOTATIONS": appwrapper.SHOWN_ANNOTATIONS,
    "ESTIMATED": estimate.ESTIMATED,
    "ESTIMATE_FRACTION": f"{estimatetold.FRACTION:.0%}",
    "ESTIMATE_FLOOR_SECONDS": f"{estimatetold.FLOOR_SECONDS:g}",
    "ESTIMATE_MIN_SECONDS": f"{estimatetold.MIN_SECONDS_BETWEEN:g}",
}


@dataclass(frozen=True)
class Field:
    path: str
    type: str
    bounds: tuple[str, ...] = ()
    default: str = ""
    description: str = ""
    patterns: tuple[str, ...] = field(default=())


def load_crd(path: Path = CRD) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def load_table(path: Path = TABLE) -> dict[str, Any]:
    table: dict[str, Any] = yaml.safe_load(path.read_text())
    return table


def served_version(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    versions = [v for v in crd["spec"]["versions"] if v.get("served")]
    if len(versions) != 1:
        raise SystemExit(f"expected one served version, found {len(versions)}")
    version: Mapping[str, Any] = versions[0]
    return version


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _type(schema: Mapping[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    kind = schema.get("type", "")
    if kind == "array":
        return f"[]{_type(schema.get('items', {}))}"
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            return f"map[string]{_type(values)}"
        if schema.get("x-kubernetes-embedded-resource"):
            return "object (a Kubernetes object)"
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return "object (any fields)"
        return "object (atomic)" if schema.get("x-kubernetes-map-type") == "atomic" else "object"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


def _bounds(schema: Mapping[str, Any], required: bool) -> tuple[list[str], list[str]]:
    """The bounds of one field, and the patterns among them (shown below the tables: they hold ``|``)."""
    out = ["required"] if required else []
    patterns: list[str] = []
    for key, label in (("minimum", "min"), ("maximum", "max"), ("minLength", "minLength"),
                       ("maxLength", "maxLength"), ("minItems", "minItems"), ("maxItems", "maxItems")):
        if key in schema:
            out.append(f"{label} {schema[key]}")
    if "enum" in schema:
        out.append("one of " + ", ".join(f"`{_value(v)}`" for v in schema["enum"]))
    if "pattern" in schema:
        patterns.append(schema["pattern"])
    if schema.get("x-kubernetes-embedded-resource"):
        out.append("`apiVersion` and `kind` required")
    values = schema.get("additionalProperties")
    if isinstance(values, Mapping):
        inner, inner_patterns = _bounds(values, False)
        out += [f"each value: {bound}" for bound in inner]
        patterns += inner_patterns
        if inner_patterns:
            out.append("each value: a Kubernetes quantity ([pattern](#patterns))")
    return out, patterns


def fields(crd: Mapping[str, Any]) -> list[Field]:
    """Every field path of the served version's schema (see the module docstring)."""
    root = served_version(crd)["schema"]["openAPIV3Schema"]
    return list(_walk(root, ""))


def _walk(schema: Mapping[str, Any], prefix: str) -> Iterator[Field]:
    required = set(schema.get("required", ()))
    rules: dict[str, list[str]] = {}
    for rule in schema.get("x-kubernetes-validations", ()):
        child = str(rule.get("fieldPath", "")).lstrip(".")
        rules.setdefault(child, []).append(f"rule: {rule.get('message') or rule['rule']}")
    for name, child in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        bounds, patterns = _bounds(child, name in required)
        bounds += rules.get(name, [])
        default = _value(child["default"]) if "default" in child else ""
        yield Field(path, _type(child), tuple(bounds), default, " ".join(str(child.get("description", "")).split()),
                    tuple(patterns))
        yield from _children(child, path)


def _children(schema: Mapping[str, Any], path: str) -> Iterator[Field]:
    if schema.get("type") == "array":
        items = schema.get("items", {})
        if items.get("type") == "object" and items.get("properties"):
            yield from _walk(items, f"{path}[].")
    elif schema.get("type") == "object" and schema.get("properties"):
        yield from _walk(schema, f"{path}.")


def problems(found: list[Field], table: Mapping[str, Any]) -> list[str]:
    """What keeps the table from describing the CRD and the code (see the module docstring)."""
    rows = table.get("fields") or {}
    paths = [f.path for f in found]
    out = [f"CRD field {path} has no row in {TABLE.name}" for path in paths if path not in rows]
    out += [f"{TABLE.name} has a row for {path}, which the CRD lacks" for path in rows if path not in paths]
    for path, row in rows.items():
        if not isinstance(row, Mapping) or row.get("use") not in USES or not str(row.get("does", "")).strip():
            out.append(f"{TABLE.name}: the row of {path} needs a use ({', '.join(USES)}) and a does")
    status_uses = {"writes", "unwritten"}
    for path, row in rows.items():
        if isinstance(row, Mapping) and (path.startswith("status.") or path == "status") != (row.get("use")
                                                                                             in status_uses):
            out.append(f"{TABLE.name}: {path} has use {row.get('use')!r}: status fields are writes or unwritten, "
                       f"the others acts or ignored")
    annotations = table.get("annotations") or {}
    out += [f"annotation {name} (mcad.api.faulttolerance) has no row in {TABLE.name}"
            for name in faulttolerance.ANNOTATIONS if name not in annotations]
    if minruntime.MIN_RUNTIME not in annotations:
        out.append(f"annotation {minruntime.MIN_RUNTIME} (mcad.api.minruntime) has no row in {TABLE.name}")
    return out


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _prose(text: str) -> str:
    return _cell(string.Template(str(text)).substitute(CONSTANTS))


def _table(found: list[Field], rows: Mapping[str, Any]) -> list[str]:
    lines = ["| field | type | bounds | default | description (CRD) | what mcad does |",
             "|---|---|---|---|---|---|"]
    for f in found:
        row = rows[f.path]
        lines.append(f"| `{f.path}` | {_cell(f.type)} | {_cell('; '.join(f.bounds))} | "
                     f"{f'`{f.default}`' if f.default else ''} | {_cell(f.description)} | "
                     f"**{USES[row['use']]}.** {_prose(row['does'])} |")
    return lines


def _annotations(table: Mapping[str, Any]) -> list[str]:
    rows = table["annotations"]
    d = faulttolerance.DEFAULTS
    flags = faultflags.FLAGS
    lines = ["| annotation | value | cluster default (flag) | floor | ceiling | what mcad does |",
             "|---|---|---|---|---|---|"]
    for name in (*faulttolerance.ANNOTATIONS, minruntime.MIN_RUNTIME):
        if name == minruntime.MIN_RUNTIME:
            value = "a Go duration (`90s`, `5m`, `1h30m`)"
            default = f"`{faulttolerance.format_duration(minruntime.DEFAULT.default)}` (`--preemption-min-runtime`)"
            floor = ""
            ceiling = f"`{faulttolerance.format_duration(minruntime.DEFAULT_CEILING)}` " \
                "(`--preemption-min-runtime-ceiling`)"
        elif name in faulttolerance.DURATIONS:
            attr = faulttolerance.DURATIONS[name]
            value = "a Go duration (`90s`, `5m`, `1h30m`)"
            default = f"`{faulttolerance.format_duration(getattr(d, attr))}` (`{flags[attr]}`)"
            floor_name = faulttolerance.FLOORED.get(name)
            floor = (f"`{faulttolerance.format_duration(d.floor(name))}` (`{flags[floor_name]}`)"
                     if floor_name else "")
            ceiling_attr = "success_ttl_ceiling" if name == faulttolerance.SUCCESS_TTL else "grace_ceiling"
            ceiling = f"`{faulttolerance.format_duration(d.ceiling(name))}` (`{flags[ceiling_attr]}`)"
        elif name == faulttolerance.RETRY_LIMIT:
            value, default = f"an integer, 0 to {faulttolerance.MAX_RETRY_LIMIT}", f"`{d.retry_limit}` " \
                f"(`{flags['retry_limit']}`)"
            floor, ceiling = "", f"`{faulttolerance.MAX_RETRY_LIMIT}`"
        elif name == faulttolerance.DELETE_WHEN_FINISHED:
            value = '`"true"` or `"false"`'
            default = f"`{_value(d.delete_when_finished)}` (`--delete-finished-appwrappers`)"
            floor = ceiling = ""
        else:
            value = f"comma-separated exit codes (1 to 255), at most {faulttolerance.MAX_EXIT_CODES}"
            default, floor, ceiling = "none", "", ""
        lines.append(f"| `{name}` | {value} | {default} | {floor} | {ceiling} | {_prose(rows[name])} |")
    others = [name for name in rows if name not in (*faulttolerance.ANNOTATIONS, minruntime.MIN_RUNTIME)]
    if others:
        lines += ["", "| annotation | what mcad does |", "|---|---|"]
        lines += [f"| `{name}` | {_prose(rows[name])} |" for name in others]
    return lines


def render(crd: Mapping[str, Any], table: Mapping[str, Any]) -> str:
    found = fields(crd)
    rows = table["fields"]
    version = served_version(crd)
    group, names = crd["spec"]["group"], crd["spec"]["names"]
    counts = {use: sum(1 for f in found if rows[f.path]["use"] == use) for use in USES}
    sections = [
        ("Top level and metadata", [f for f in found if not f.path.startswith(("spec", "status"))]),
        ("spec", [f for f in found if f.path == "spec" or f.path.startswith("spec.")]),
        ("status", [f for f in found if f.path == "status" or f.path.startswith("status.")]),
    ]
    lines = [
        "# AppWrapper API reference",
        "",
        "<!-- Generated by hack/gen-api-reference.py from config/crd/workload.codeflare.dev_appwrappers.yaml and "
        "hack/api-reference.yaml: edit those and run `make api-reference`. -->",
        "",
        _prose(table["intro"]),
        "",
        f"`{group}/{version['name']}`, kind `{names['kind']}` (resource `{names['plural']}`, short name "
        f"`{', '.join(names.get('shortNames', []))}`). The same schema is served under the legacy group "
        f"`{appwrapper.LEGACY_GROUP}` (resource `{appwrapper.LEGACY_PLURAL}`) with `--legacy-api`.",
        "",
        f"{len(found)} fields: {counts['acts']} acted on, {counts['ignored']} accepted and ignored (stored as "
        f"written, never read), {counts['writes']} status fields mcad writes and {counts['unwritten']} it never "
        f"writes. Bounds, defaults and descriptions are the CRD's: the API server enforces them; \"what mcad "
        f"does\" is the controller's and the admission webhook's part.",
        "",
        "- " + "\n- ".join(f"[{title}](#{_slug(title)})" for title, _ in sections),
        "- [Annotations](#annotations)",
        "- [Labels](#labels)",
        "- [Patterns](#patterns)",
    ]
    for title, part in sections:
        lines += ["", f"## {title}", ""]
        if table.get("sections", {}).get(title):
            lines += [_prose(table["sections"][title]), ""]
        lines += _table(part, rows)
    lines += ["", "## Annotations", "", _prose(table["sections"]["Annotations"]), ""]
    lines += _annotations(table)
    lines += ["", "## Labels", "", _prose(table["sections"]["Labels"]), "", "| label | on | what mcad does |",
              "|---|---|---|"]
    for name, row in table["labels"].items():
        lines.append(f"| `{_prose(name)}` | {_prose(row['on'])} | {_prose(row['does'])} |")
    lines += ["", "## Patterns", "", "Patterns are regular expressions the API server matches each value against:",
              ""]
    by_pattern: dict[str, list[str]] = {}
    for f in found:
        for pattern in f.patterns:
            by_pattern.setdefault(pattern, []).append(f"`{f.path}`")
    for pattern, paths in by_pattern.items():
        lines += [f"- each value of {' and '.join(paths)}:", "", "  ```", f"  {pattern}", "  ```"]
    return "\n".join(lines) + "\n"


def _slug(title: str) -> str:
    return title.lower().replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {OUTPUT.relative_to(REPO)} is not what "
                                                             f"the generator writes; write nothing")
    args = parser.parse_args(argv)
    crd, table = load_crd(), load_table()
    found = problems(fields(crd), table)
    if found:
        for problem in found:
            print(problem, file=sys.stderr)
        return 1
    text = render(crd, table)
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(REPO)} is out of date: run make api-reference", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
