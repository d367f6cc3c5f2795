"""JSON schemas a client sends (``response_format``, tool ``parameters``, the Responses API's
``text.format``): what constrained decoding can promise, and tool schemas made to stand alone
inside the call envelope.

:func:`check_enforceable` refuses, with a 400 naming the keyword and the field, every schema feature
the grammar engine (xgrammar 0.2.7) would silently drop or get wrong, found by trying each against
its matcher: a request that is accepted gets a reply that validates, never a 200 whose content
breaks the schema. It also refuses a schema no finite value satisfies (a property that requires
itself), which would leave the grammar nothing to generate. Unknown keywords are ignored, as JSON
Schema ignores them; annotations (``title``, ``description``, ``default``...) too.

:func:`relocate` rewrites a tool's local ``$ref`` pointers so the schema still means the same once it sits
at ``#/$defs/<name>`` of the envelope (``#/$defs/P`` of the tool becomes ``#/$defs/<name>/$defs/P``).
"""

from __future__ import annotations

from typing import Any, Iterator

from backends.server.errors import APIError

__all__ = ["check_enforceable", "relocate"]

_UNSUPPORTED = {
    "not": "negation",
    "if": "conditional subschemas", "then": "conditional subschemas", "else": "conditional subschemas",
    "contains": "array containment", "minContains": "array containment", "maxContains": "array containment",
    "patternProperties": "property-name patterns",
    "dependentRequired": "dependent properties", "dependentSchemas": "dependent properties",
    "dependencies": "dependent properties",
}
"""Keywords the grammar ignores (or, for patternProperties, enforces wrongly), with what they express."""
_STRING_FORMATS_IGNORED = frozenset({"idn-email", "iri", "iri-reference", "idn-hostname", "regex"})
"""Standard string formats the grammar does not check (formats it does not know are annotations)."""
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor",
                          "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
                          "discriminator", "nullable", "strict", "$defs", "definitions"})
"""Keywords that constrain nothing here; any other keyword beside ``$ref``/``enum``/``const``/a
combinator would be dropped by the grammar, so it is refused there."""
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_VALUES = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "unevaluatedItems",
                  "propertyNames")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_JSON_TYPES = {"null": (type(None),), "boolean": (bool,), "object": (dict,), "array": (list,), "string": (str,),
               "number": (int, float), "integer": (int,)}
_MAX_DEPTH = 64
_MAX_REFS = 256
_MAX_ONE_OF = 64
"""Bounds on the checking work one schema may ask for (past them: a 400 naming the bound)."""


def check_enforceable(schema: Any, param: str) -> None:
    """Raise a 400 (``param`` set to the field that carries ``schema``) for a schema constrained
    decoding cannot enforce exactly, naming the keyword and where it is (a JSON pointer)."""
    for pointer, node in _nodes(schema, "#", param, 0):
        problem = _problem(node, schema)
        if problem is not None:
            keyword, why = problem
            raise APIError(400, f"{param}: `{keyword}` at {pointer} {why}", code="unsupported_schema", param=param)
    if not _satisfiable(schema, param):
        raise APIError(400, f"{param}: no finite JSON value satisfies this schema (a `$ref` cycle with no way out, or "
                       "a required `false` subschema), so nothing could be generated", code="unsupported_schema",
                       param=param)


def relocate(schema: Any, at: str) -> Any:
    """``schema`` with every local ``$ref`` prefixed by ``at`` (a JSON pointer such as ``#/$defs/t0``)."""
    if isinstance(schema, list):
        return [relocate(item, at) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: relocate(value, at) for key, value in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = at + ref[1:]
    return out


# ----------------------------------------------------------------------------- the walk


def _nodes(schema: Any, pointer: str, param: str, depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema that is an object, with its pointer; a 400 for one that is not a schema."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise APIError(400, f"{param}: {pointer} is not a schema (an object or a boolean)", code="invalid_schema",
                       param=param)
    if depth > _MAX_DEPTH:
        raise APIError(400, f"{param}: nested more than {_MAX_DEPTH} levels deep", code="invalid_schema", param=param)
    yield pointer, schema
    for key in _SCHEMA_MAPS:
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _nodes(child, f"{pointer}/{key}/{_escape(str(name))}", param, depth + 1)
        elif children is not None:
            raise APIError(400, f"{param}: {pointer}/{key} must be an object", code="invalid_schema", param=param)
    for key in _SCHEMA_VALUES:
        if key in schema and not (key == "items" and isinstance(schema[key], list)):  # list items: the grammar's error
            yield from _nodes(schema[key], f"{pointer}/{key}", param, depth + 1)
    for key in _SCHEMA_LISTS:
        children = schema.get(key)
        if isinstance(children, list):
            for i, child in enumerate(children):
                yield from _nodes(child, f"{pointer}/{key}/{i}", param, depth + 1)
        elif children is not None:
            raise APIError(400, f"{param}: {pointer}/{key} must be an array", code="invalid_schema", param=param)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _types(node: dict[str, Any]) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return set(declared)
    return None


def _problem(node: dict[str, Any], root: Any) -> tuple[str, str] | None:
    """The first keyword of ``node`` (one subschema) the grammar cannot enforce, and why."""
    for keyword, what in _UNSUPPORTED.items():
        if keyword in node:
            return keyword, f"({what}) cannot be enforced by constrained decoding"
    types = _types(node)
    if node.get("uniqueItems") is True:
        return "uniqueItems", "cannot be enforced by constrained decoding (the grammar cannot compare items)"
    if "multipleOf" in node and types != {"integer"}:
        return "multipleOf", "is enforced for integers only; set type to integer or drop it"
    if node.get("format") in _STRING_FORMATS_IGNORED and (types is None or "string" in types):
        return "format", f"{node['format']!r} cannot be enforced by constrained decoding"
    bounded = [k for k in ("minLength", "maxLength") if k in node]
    if bounded and ("pattern" in node or "format" in node):
        return bounded[0], "cannot be combined with pattern or format (the grammar would drop the length)"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "allOf", "with more than one schema cannot be enforced (the grammar keeps only the first); merge them"
    if isinstance(node.get("oneOf"), list):
        if len(node["oneOf"]) > _MAX_ONE_OF:
            return "oneOf", f"with more than {_MAX_ONE_OF} branches cannot be checked for overlap; use anyOf"
        overlap = _overlapping(node["oneOf"], root)
        if overlap is not None:
            return "oneOf", (f"branches {overlap[0]} and {overlap[1]} may both match, so exactly-one cannot be "
                             "enforced; use anyOf, or tell them apart by a required const property")
    for head in ("$ref", "anyOf", "oneOf", "allOf", "enum", "const"):
        if head in node:
            allowed = _ANNOTATIONS | {head} | ({"type"} if head in ("enum", "const") else set())
            extra = sorted(k for k in node if k not in allowed)
            if extra:
                where = "; move it into the referenced schema" if head == "$ref" else ""
                return extra[0], f"beside `{head}` would be dropped by the grammar{where}"
    values = node["enum"] if isinstance(node.get("enum"), list) else [node["const"]] if "const" in node else []
    if types is not None and any(not _has_type(v, types) for v in values):
        return "type", "excludes some enum/const values (the grammar would let them through); drop them or the type"
    required = node.get("required")
    if isinstance(required, list) and isinstance(node.get("properties", {}), dict):
        missing = [name for name in required if name not in node.get("properties", {})]
        if missing:
            return "required", (f"names {missing[0]!r}, which properties does not define "
                                "(the grammar would not require it)")
    ref = node.get("$ref")
    if ref is not None and _resolve(ref, root) is None:
        return "$ref", f"{ref!r} is not a pointer into this schema ('#' or '#/...')"
    return None


def _has_type(value: Any, types: set[str]) -> bool:
    for name in types:
        kinds = _JSON_TYPES.get(name)
        if kinds and isinstance(value, kinds) and not (isinstance(value, bool) and name in ("number", "integer")):
            if name != "integer" or isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
                return True
    return False


def _resolve(ref: Any, root: Any) -> Any:
    """The subschema a local ``$ref`` points to (``None``: not local, or nothing there)."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _deref(node: Any, root: Any) -> Any:
    for _ in range(_MAX_DEPTH):
        if not (isinstance(node, dict) and "$ref" in node):
            return node
        node = _resolve(node["$ref"], root)
    return node


def _overlapping(branches: list[Any], root: Any) -> tuple[int, int] | None:
    """Two branches of a oneOf that are not provably disjoint (by type, or by a required property
    whose const/enum values differ), or ``None``."""
    resolved = [_deref(b, root) for b in branches]
    for i in range(len(resolved)):
        for j in range(i + 1, len(resolved)):
            if not _disjoint(resolved[i], resolved[j], root):
                return i, j
    return None


def _value_types(node: dict[str, Any]) -> set[str] | None:
    types = _types(node)
    if types is not None:
        return {"number" if t == "integer" else t for t in types}
    values = node["enum"] if isinstance(node.get("enum"), list) else [node["const"]] if "const" in node else None
    if values is None:
        return None
    return {next(name for name in ("null", "boolean", "object", "array", "string", "number")
                 if _has_type(v, {name})) for v in values if _has_type(v, set(_JSON_TYPES))}


def _literals(node: Any) -> list[Any] | None:
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node.get("enum"), list) else None


def _disjoint(a: Any, b: Any, root: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is False or b is False
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    ta, tb = _value_types(a), _value_types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    la, lb = _literals(a), _literals(b)
    if la is not None and lb is not None:
        return not any(x == y for x in la for y in lb)
    pa, pb = a.get("properties"), b.get("properties")
    if not (isinstance(pa, dict) and isinstance(pb, dict)):
        return False
    both_required = set(a.get("required") or ()) & set(b.get("required") or ())
    for name in both_required & pa.keys() & pb.keys():
        va, vb = _literals(_deref(pa[name], root)), _literals(_deref(pb[name], root))
        if va is not None and vb is not None and not any(x == y for x in va for y in vb):
            return True
    return False


# ----------------------------------------------------------------------------- satisfiability


def _satisfiable(schema: Any, param: str) -> bool:
    """Whether some finite JSON value satisfies ``schema``: the local ``$ref`` pointers that can be
    satisfied are found by a fixpoint (a ref counts once its target is satisfiable with the refs
    known so far), so recursion without a way out is caught in time linear in refs x schema size."""
    refs = sorted({node["$ref"] for _, node in _nodes(schema, "#", param, 0) if isinstance(node.get("$ref"), str)})
    if len(refs) > _MAX_REFS:
        raise APIError(400, f"{param}: {len(refs)} distinct $ref targets; the limit is {_MAX_REFS}",
                       code="invalid_schema", param=param)
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for ref in refs:
            if ref not in known and _satisfied(_resolve(ref, schema), known):
                known.add(ref)
                changed = True
    return _satisfied(schema, known)


def _satisfied(node: Any, known: set[str]) -> bool:
    """:func:`_satisfiable` of one subschema, a ``$ref`` counting as satisfiable when in ``known``."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        return True
    if isinstance(node.get("$ref"), str):
        return node["$ref"] in known
    if isinstance(node.get("enum"), list) and not node["enum"]:
        return False
    for key, need_all in (("allOf", True), ("anyOf", False), ("oneOf", False)):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            results = (_satisfied(b, known) for b in branches)
            if not (all(results) if need_all else any(results)):
                return False
    types = _types(node)
    if types is None or types - {"object", "array"}:
        return True  # a scalar type (or any type) always has some value
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = [name for name in node.get("required") or () if isinstance(name, str)]
    if "object" in types and all(_satisfied(properties.get(name, True), known) for name in required):
        return True
    if "array" in types:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        wanted = node.get("minItems", 0) if isinstance(node.get("minItems"), int) else 0
        items = node.get("items", True)
        return all(_satisfied(s, known) for s in [*prefix, *([items] * max(0, wanted - len(prefix)))][:wanted])
    return False
