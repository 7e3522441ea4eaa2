"""Write docs/crd-reference.md: every field of every CRD in crds/*.yaml, from the schemas.

    .venv/bin/python -P scripts/gen-crd-reference.py          # rewrite the file
    .venv/bin/python -P scripts/gen-crd-reference.py --check  # exit 1 if it is stale

tests/unit/test_docs.py fails when the file differs from what this script makes, so a CRD
change and its reference land together.

The CRDs are kept once: the YAML in charts/strata/crds/ (Helm installs that folder, users
apply it, manifests/install.yaml is rendered from the chart), with crds/ a link to it. The
schemas stay written by hand rather than generated from operator/models.py: what the API
server enforces (structural types, defaults, CEL rules with their messages and cost bounds,
int-or-string quantities, printer columns, the scale subresource, a description on every
field) has no faithful form in the pydantic models, whose checks are Python (sizes parsed,
paths normalised, tiers ordered). tests/unit/operator/test_crds.py holds the two together:
the defaults the schema fills parse to the models' defaults, and both refuse the same paths.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "crds"
OUTPUT = REPO / "docs" / "crd-reference.md"
# Our own API first; the kopf peering CRDs the operator needs follow.
GROUP_ORDER = ("strata.dev",)
Schema = dict[str, Any]


@dataclass(frozen=True)
class Field:
    path: str
    type: str
    default: str
    description: str


def load_crds(folder: Path = CRDS) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of every YAML file in `folder`, our group first."""
    crds = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc)

    def order(crd: dict[str, Any]) -> tuple[int, str]:
        group = crd["spec"]["group"]
        rank = GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)
        return rank, crd["metadata"]["name"]

    return sorted(crds, key=order)


def type_name(schema: Schema) -> str:
    """The field's type the way Go/kubectl docs write it: []object, map[string]string."""
    kind = schema.get("type", "")
    if kind == "array":
        return "[]" + type_name(schema.get("items", {}))
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return "map[string]" + type_name(extra)
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return "object (free-form)"
        return "object"
    if kind and schema.get("format"):
        return f"{kind} ({schema['format']})"
    return kind or "any"


def constraints(schema: Schema, required: bool) -> list[str]:
    """What the API server enforces on a field, in words."""
    notes = []
    if required:
        notes.append("Required.")
    if "enum" in schema:
        notes.append("One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".")
    notes.extend(_bounds(schema))
    if "pattern" in schema:
        notes.append(f"Matches `{schema['pattern']}`.")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(schema.get("x-kubernetes-list-map-keys", []))
        notes.append(f"A list keyed by {keys}.")
    for rule in schema.get("x-kubernetes-validations", []):
        note = "Immutable." if rule.get("rule") == "self == oldSelf" else \
            f"Rule: {_one_line(rule.get('message') or rule['rule'])}"
        if note not in notes:
            notes.append(note)
    return notes


def _bounds(schema: Schema) -> Iterator[str]:
    """Numeric, length and item-count limits, e.g. "Range: 0 < value <= 1."."""
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None or high is not None:
        lower = f"{low} {'<' if schema.get('exclusiveMinimum') else '<='} " if low is not None else ""
        upper = f" {'<' if schema.get('exclusiveMaximum') else '<='} {high}" if high is not None else ""
        yield f"Range: {lower}value{upper}."
    for low_key, high_key, unit in (("minLength", "maxLength", "characters"), ("minItems", "maxItems", "items")):
        low, high = schema.get(low_key), schema.get(high_key)
        if low is not None and high is not None:
            yield f"{low} to {high} {unit}."
        elif low is not None:
            yield f"At least {low} {unit if low != 1 else unit[:-1]}."
        elif high is not None:
            yield f"At most {high} {unit if high != 1 else unit[:-1]}."


def walk(schema: Schema, prefix: str = "", required: bool = False) -> Iterator[Field]:
    """Every field below `schema`, depth first in the schema's order; list items as `[]`."""
    if prefix:
        default = json.dumps(schema["default"], separators=(", ", ": ")) if "default" in schema else ""
        notes = constraints(schema, required)
        items = schema.get("items")
        if isinstance(items, dict) and not items.get("properties") and (item_notes := constraints(items, False)):
            joined = " ".join(item_notes)
            notes.append("Each item: " + joined[0].lower() + joined[1:])
        text = " ".join([_one_line(schema.get("description", "")), *notes]).strip()
        yield Field(prefix, type_name(schema), default, text)
    items = schema.get("items")
    below, base = (items, prefix + "[]") if isinstance(items, dict) else (schema, prefix)
    needed = set(below.get("required", []))
    for name, child in below.get("properties", {}).items():
        if not base and name in ("apiVersion", "kind", "metadata"):
            continue
        yield from walk(child, f"{base}.{name}" if base else name, name in needed)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _cell(text: str) -> str:
    """Markdown table cell: pipes escaped, and <words> outside `code` shown, not taken as HTML."""
    return _prose(text).replace("|", "\\|")


def _prose(text: str) -> str:
    """<name> outside `code` would be taken for an HTML tag: show it as text."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"<(?=[A-Za-z/!])", "&lt;", parts[i])
    return "`".join(parts)


def render_crd(crd: dict[str, Any]) -> str:
    spec = crd["spec"]
    names = spec["names"]
    lines = []
    for version in spec["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        lines.append(f"## {names['kind']} ({spec['group']}/{version['name']})")
        lines.append("")
        facts = ["namespaced" if spec["scope"] == "Namespaced" else "cluster-scoped", f"plural `{names['plural']}`"]
        if names.get("shortNames"):
            facts.append("short names " + ", ".join(f"`{n}`" for n in names["shortNames"]))
        if names.get("categories"):
            facts.append("categories " + ", ".join(f"`{n}`" for n in names["categories"]))
        subresources = version.get("subresources", {})
        if "status" in subresources:
            facts.append("status subresource")
        if "scale" in subresources:
            scale = subresources["scale"]
            facts.append(f"scale subresource (`{scale['specReplicasPath']}`)")
        lines.append(". ".join(f[0].upper() + f[1:] for f in facts) + ".")
        lines.append("")
        if schema.get("description"):
            lines.append(_prose(_one_line(schema["description"])))
            lines.append("")
        rules = constraints({"x-kubernetes-validations": schema.get("x-kubernetes-validations", [])}, False)
        if rules:
            lines.extend(f"- {_prose(r)}" for r in rules)
            lines.append("")
        columns = version.get("additionalPrinterColumns", [])
        if columns:
            lines.append(f"`kubectl get {names['plural']}` columns:")
            lines.append("")
            lines.append("| Column | From | Description |")
            lines.append("| --- | --- | --- |")
            for col in columns:
                lines.append(f"| {col['name'].upper()} | `{col['jsonPath']}` | {_cell(_one_line(col.get('description', '')))} |")
            lines.append("")
        lines.append("| Field | Type | Default | Description |")
        lines.append("| --- | --- | --- | --- |")
        for field in walk(schema):
            default = f"`{field.default}`" if field.default else ""
            lines.append(f"| `{field.path}` | {field.type} | {_cell(default)} | {_cell(field.description)} |")
        lines.append("")
    return "\n".join(lines)


def render(crds: list[dict[str, Any]]) -> str:
    head = [
        "# CRD reference",
        "",
        "<!-- Generated by scripts/gen-crd-reference.py from crds/*.yaml: do not edit by hand. -->",
        "",
        "Every field of the CustomResourceDefinitions in `crds/`, with its type, default and the",
        "checks the API server applies. Regenerate after changing a CRD:",
        "`.venv/bin/python -P scripts/gen-crd-reference.py`.",
        "",
    ]
    head += [f"- [{c['spec']['names']['kind']} ({c['spec']['group']})](#{_anchor(c)})" for c in crds]
    head.append("")
    return "\n".join(head) + "\n" + "\n".join(render_crd(c) for c in crds)


def _anchor(crd: dict[str, Any]) -> str:
    spec = crd["spec"]
    title = f"{spec['names']['kind']} {spec['group']}{spec['versions'][0]['name']}"
    return title.lower().replace(" ", "-").replace(".", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/crd-reference.md is stale")
    args = parser.parse_args(argv)
    text = render(load_crds())
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(REPO)} is stale: run .venv/bin/python -P scripts/gen-crd-reference.py",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
