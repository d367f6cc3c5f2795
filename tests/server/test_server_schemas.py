"""What constrained decoding can promise for a client's JSON schema (``backends.server.schemas``):
the schemas pydantic writes for ordinary models pass, every keyword the grammar would drop is a
400 naming it and where it is, and a tool schema keeps its meaning once relocated into the call
envelope. Each refused keyword is also checked against xgrammar itself: its grammar accepts a value
the schema forbids (or nothing at all), which is why it is refused."""

from __future__ import annotations

import enum
import json
from typing import Literal, Optional, Union

import jsonschema
import pytest
from pydantic import BaseModel, Field

from backends.server.errors import APIError
from backends.server.schemas import check_enforceable, relocate


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Place(BaseModel):
    city: str = Field(max_length=20)
    days: int = Field(ge=1)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Everything(BaseModel):
    place: Place
    stops: list[Place]
    note: Optional[str] = None
    color: Color
    mode: Literal["fast", "slow"]
    scores: dict[str, float]
    pair: tuple[int, str]
    pet: Union[Cat, Dog] = Field(discriminator="kind")
    either: Union[int, str]


def test_schemas_pydantic_writes_are_accepted() -> None:
    check_enforceable(Everything.model_json_schema(), "p")


# keyword, schema, a JSON text the schema forbids that the grammar lets through (None: the grammar
# accepts nothing at all; ("valid", text): the grammar refuses a value the schema allows; ("any",):
# the grammar accepts values of every type, the keyword dropped)
REFUSED = [
    ("not", {"not": {"type": "string"}}, '"a"'),
    ("if", {"if": {"type": "string"}, "then": {"maxLength": 1}}, '"ab"'),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1,1]"),
    ("contains", {"type": "array", "items": {}, "contains": {"type": "integer"}}, '["a"]'),
    ("patternProperties", {"type": "object", "patternProperties": {"^a": {"type": "integer"}}}, ("valid", '{"ab":1}')),
    ("dependentRequired", {"type": "object", "additionalProperties": True, "dependentRequired": {"a": ["b"]}},
     '{"a":1}'),
    ("multipleOf", {"type": "number", "multipleOf": 3}, "4"),
    ("format", {"type": "string", "format": "idn-email"}, '"no at sign"'),
    ("maxLength", {"type": "string", "pattern": "^a+$", "maxLength": 2}, '"aaa"'),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 1}]}, "0"),
    ("allOf", {"allOf": [{"type": "string"}, {"type": "integer"}]}, '"a"'),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    ("maxLength", {"$ref": "#/$defs/S", "maxLength": 1, "$defs": {"S": {"type": "string"}}}, '"ab"'),
    ("type", {"const": "a", "type": "integer"}, '"a"'),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}, '{"a":1}'),
    ("$ref", {"$ref": "http://example.com/s"}, ("any",)),
    ("no finite", {"$ref": "#"}, None),
    ("no finite", {"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}, None),
]


@pytest.mark.parametrize("keyword,schema,forbidden", REFUSED, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(REFUSED)])
def test_what_the_grammar_would_drop_is_refused_by_name(keyword: str, schema: dict, forbidden) -> None:
    with pytest.raises(APIError) as err:
        check_enforceable(schema, "tools.0.function.parameters")
    assert err.value.status == 400 and err.value.param == "tools.0.function.parameters"
    assert keyword in err.value.message and (keyword == "no finite" or f"`{keyword}` at #" in err.value.message)
    # why: xgrammar's grammar for the schema lets the forbidden value through, or accepts nothing
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
    if forbidden is None:
        assert not any(_is_grammar_accept_string(grammar, v) for v in ("{}", "1", '"a"', "[]", "null", '{"c":{}}'))
    elif forbidden == ("any",):
        assert all(_is_grammar_accept_string(grammar, v) for v in ("1", '"a"', "[]"))
    elif isinstance(forbidden, tuple):
        jsonschema.validate(json.loads(forbidden[1]), schema)
        assert not _is_grammar_accept_string(grammar, forbidden[1])
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(forbidden), schema,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        assert _is_grammar_accept_string(grammar, forbidden)


def test_the_keyword_is_located_by_a_json_pointer() -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                        "uniqueItems": True}}}
    with pytest.raises(APIError, match="`uniqueItems` at #/properties/tags"):
        check_enforceable(schema, "response_format.json_schema.schema")


@pytest.mark.parametrize("schema", [[1], {"properties": []}, {"anyOf": {}}, {"items": 3}])
def test_what_is_not_a_schema_is_a_400(schema) -> None:
    with pytest.raises(APIError) as err:
        check_enforceable(schema, "p")
    assert err.value.status == 400 and err.value.param == "p"


def test_relocated_tool_schema_means_the_same_inside_the_envelope() -> None:
    tool = Everything.model_json_schema()
    envelope = {"type": "object", "properties": {"arguments": {"$ref": "#/$defs/tool_0"}}, "required": ["arguments"],
                "$defs": {"tool_0": relocate(tool, "#/$defs/tool_0")}}
    good = {"place": {"city": "Oslo", "days": 2}, "stops": [], "color": "red", "mode": "fast", "scores": {},
            "pair": [1, "a"], "pet": {"kind": "cat", "lives": 9}, "either": 3}
    jsonschema.validate(good, tool)
    jsonschema.validate({"arguments": good}, envelope)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"arguments": {**good, "place": {"city": "Oslo", "days": 0}}}, envelope)
    assert relocate({"$ref": "#"}, "#/$defs/t") == {"$ref": "#/$defs/t"}
