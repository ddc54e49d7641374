"""30 JSON schemas of the shapes agents ask for (flat records, nesting, arrays, enums,
formats, unions, optional fields, bounds), each with the question that goes with it:
the suite tests/engine/test_constrained_default.py decodes with the default model and
validates with jsonschema."""

_str = {"type": "string", "maxLength": 40}

SCHEMAS = [
    ("Give a person's name and age.", {"type": "object", "properties": {"name": _str, "age": {"type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"], "additionalProperties": False}),
    ("Is the sky blue? Answer with a boolean.", {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": False}),
    ("Pick a primary colour.", {"type": "object", "properties": {"colour": {"enum": ["red", "yellow", "blue"]}}, "required": ["colour"], "additionalProperties": False}),
    ("List three fruits.", {"type": "object", "properties": {"fruits": {"type": "array", "items": _str, "minItems": 3, "maxItems": 3}}, "required": ["fruits"], "additionalProperties": False}),
    ("Give the coordinates of Paris.", {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"], "additionalProperties": False}),
    ("Describe a book.", {"type": "object", "properties": {"title": _str, "author": _str, "year": {"type": "integer", "minimum": 1000, "maximum": 2100}, "genres": {"type": "array", "items": {"enum": ["fiction", "history", "science", "poetry"]}, "maxItems": 3}}, "required": ["title", "author", "year", "genres"], "additionalProperties": False}),
    ("Give an address.", {"type": "object", "properties": {"street": _str, "city": _str, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"], "additionalProperties": False}),
    ("A user with a nested profile.", {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99999}, "profile": {"type": "object", "properties": {"nickname": _str, "verified": {"type": "boolean"}}, "required": ["nickname", "verified"], "additionalProperties": False}}, "required": ["id", "profile"], "additionalProperties": False}}, "required": ["user"], "additionalProperties": False}),
    ("Rate this film from 1 to 5.", {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": _str}, "required": ["stars"], "additionalProperties": False}),
    ("A meeting date.", {"type": "object", "properties": {"date": {"type": "string", "format": "date"}}, "required": ["date"], "additionalProperties": False}),
    ("An email contact.", {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"], "additionalProperties": False}),
    ("A tool call to get the weather.", {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city": _str, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}}, "required": ["name", "arguments"], "additionalProperties": False}),
    ("Either a number or null.", {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": -1000, "maximum": 1000}, {"type": "null"}]}}, "required": ["value"], "additionalProperties": False}),
    ("A shape.", {"type": "object", "properties": {"shape": {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["kind", "r"], "additionalProperties": False}, {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["kind", "side"], "additionalProperties": False}]}}, "required": ["shape"], "additionalProperties": False}),
    ("A list of up to four tasks with priorities.", {"type": "object", "properties": {"tasks": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {"task": _str, "priority": {"enum": ["low", "medium", "high"]}}, "required": ["task", "priority"], "additionalProperties": False}}}, "required": ["tasks"], "additionalProperties": False}),
    ("Translate 'hello' to French.", {"type": "object", "properties": {"source": {"const": "hello"}, "french": _str}, "required": ["source", "french"], "additionalProperties": False}),
    ("A product with a price.", {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "price": {"type": "number", "minimum": 0, "maximum": 10000}, "in_stock": {"type": "boolean"}}, "required": ["sku", "price", "in_stock"], "additionalProperties": False}),
    ("Sentiment of 'I love it'.", {"type": "object", "properties": {"sentiment": {"enum": ["positive", "neutral", "negative"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["sentiment", "confidence"], "additionalProperties": False}),
    ("A 2x2 matrix of small integers.", {"type": "object", "properties": {"m": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}}, "required": ["m"], "additionalProperties": False}),
    ("Extract the city from 'I live in Oslo'.", {"type": "object", "properties": {"city": _str, "country": {"anyOf": [_str, {"type": "null"}]}}, "required": ["city", "country"], "additionalProperties": False}),
    ("An HTTP response summary.", {"type": "object", "properties": {"status": {"type": "integer", "enum": [200, 201, 400, 404, 500]}, "ok": {"type": "boolean"}}, "required": ["status", "ok"], "additionalProperties": False}),
    ("Keywords of a sentence about cats.", {"type": "object", "properties": {"keywords": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,12}$"}, "minItems": 1, "maxItems": 5}}, "required": ["keywords"], "additionalProperties": False}),
    ("A time of day.", {"type": "object", "properties": {"time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}}, "required": ["time"], "additionalProperties": False}),
    ("A fact about the moon, with an optional source.", {"type": "object", "properties": {"fact": {"type": "string", "maxLength": 80}, "source": _str}, "required": ["fact"], "additionalProperties": False}),
    ("A recipe with ingredients.", {"type": "object", "properties": {"name": _str, "ingredients": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {"item": _str, "grams": {"type": "integer", "minimum": 1, "maximum": 5000}}, "required": ["item", "grams"], "additionalProperties": False}}}, "required": ["name", "ingredients"], "additionalProperties": False}),
    ("A flag and an optional note.", {"type": "object", "properties": {"flag": {"type": "boolean"}, "note": _str}, "required": ["flag"], "additionalProperties": False}),
    ("A version number.", {"type": "object", "properties": {"version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$", "maxLength": 12}}, "required": ["version"], "additionalProperties": False}),
    ("Classify the animal 'dog'.", {"type": "object", "properties": {"animal": {"const": "dog"}, "class": {"enum": ["mammal", "bird", "fish", "reptile"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}}, "required": ["animal", "class", "legs"], "additionalProperties": False}),
    ("Three numbers that add to ten.", {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 10}}),
    ("A yes or no answer as a string.", {"type": "string", "enum": ["yes", "no"]}),
]
