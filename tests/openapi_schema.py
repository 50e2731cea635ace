"""A structural check of a document against a Kubernetes CRD's openAPIV3Schema: the subset of
OpenAPI v3 that CRDs use (type, required, properties, additionalProperties, items, enum, pattern,
anyOf, x-kubernetes-int-or-string, x-kubernetes-preserve-unknown-fields). A field the schema does
not name is reported, as ``kubectl apply`` (strict field validation, its default since Kubernetes
1.27) rejects it. No dependency: jsonschema does not read Kubernetes' extensions anyway.
"""
from __future__ import annotations

import re
from typing import Any

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool,
          "integer": int, "number": (int, float)}


def _type_ok(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False   # a YAML true is no number
    return isinstance(value, _TYPES[kind])


def problems(value: Any, schema: dict, path: str = "") -> list[str]:
    """Every way ``value`` breaks ``schema``, one line each naming its path; [] when none."""
    where = path or "(root)"
    if schema.get("x-kubernetes-int-or-string"):
        if not (_type_ok(value, "integer") or isinstance(value, str)):
            return [f"{where}: {value!r} is neither an integer nor a string"]
        schema = {"pattern": schema["pattern"]} if "pattern" in schema else {}
    if "anyOf" in schema and "type" not in schema:
        branches = [problems(value, branch, path) for branch in schema["anyOf"]]
        return [] if any(not found for found in branches) else [f"{where}: fits no anyOf"]
    kind = schema.get("type")
    if kind and not _type_ok(value, kind):
        return [f"{where}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of {schema['enum']}"]
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        return [f"{where}: {value!r} does not match {schema['pattern']}"]
    if isinstance(value, dict):
        return _object_problems(value, schema, path)
    if isinstance(value, list) and "items" in schema:
        return [p for i, item in enumerate(value)
                for p in problems(item, schema["items"], f"{path}[{i}]")]
    return []


def _object_problems(value: dict, schema: dict, path: str) -> list[str]:
    found = [f"{path or '(root)'}: required field {name!r} missing"
             for name in schema.get("required", []) if name not in value]
    fields = schema.get("properties")
    others = schema.get("additionalProperties")
    for name, item in value.items():
        where = f"{path}.{name}" if path else name
        if fields is not None and name in fields:
            found += problems(item, fields[name], where)
        elif isinstance(others, dict):
            found += problems(item, others, where)
        elif fields is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            found.append(f"{where}: unknown field")
    return found
