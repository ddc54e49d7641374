"""response_format and logit_bias through the real `openai` client on the default
model: each reply is the engine's own (Engine.chat with the same arguments), parses,
and validates; the pydantic path of client.chat.completions.parse; streamed too."""
from __future__ import annotations

import json

import pytest

from .conftest import needs_server_packages

needs_server_packages()
pydantic = pytest.importorskip("pydantic", reason="pydantic (the openai client's dependency) is not installed")

ASK = [{"role": "user", "content": "Describe a city in JSON."}]


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def test_parse_with_a_pydantic_model(smol):
    """client.chat.completions.parse sends a strict json_schema built from the model and
    parses the reply into it; the reply is the engine's for that schema."""
    r = smol.client().chat.completions.parse(model="smol", messages=ASK, response_format=City, max_tokens=120,
                                             temperature=0)
    msg = r.choices[0].message
    assert isinstance(msg.parsed, City) and r.choices[0].finish_reason == "stop"
    from openai.lib._pydantic import to_strict_json_schema
    fmt = {"type": "json_schema", "json_schema": {"name": "City", "schema": to_strict_json_schema(City), "strict": True}}
    assert msg.content == smol.engine.chat(ASK, response_format=fmt, max_tokens=120)


def test_json_object_whole_and_streamed(smol):
    ask = [{"role": "user", "content": "Reply with a JSON object with one key, ok, set to true."}]
    client = smol.client()
    r = client.chat.completions.create(model="smol", messages=ask, response_format={"type": "json_object"},
                                       max_tokens=100, temperature=0)
    text = r.choices[0].message.content
    assert isinstance(json.loads(text), dict) and r.choices[0].finish_reason == "stop"
    assert text == smol.engine.chat(ask, response_format={"type": "json_object"}, max_tokens=100)
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smol", messages=ask, response_format={"type": "json_object"}, max_tokens=100, temperature=0,
        stream=True) if c.choices]
    assert "".join(pieces) == text


def test_logit_bias_bans_and_favours_tokens(smol):
    q = [{"role": "user", "content": "Name three colours."}]
    client = smol.client()
    plain = client.chat.completions.create(model="smol", messages=q, max_tokens=8, temperature=0)
    first = smol.engine.tokenizer.encode(plain.choices[0].message.content, add_special=False)[0]
    banned = client.chat.completions.create(model="smol", messages=q, max_tokens=8, temperature=0,
                                            logit_bias={str(first): -100})
    assert banned.choices[0].message.content == smol.engine.chat(q, max_tokens=8, logit_bias={first: -100.0})
    assert smol.engine.tokenizer.encode(banned.choices[0].message.content, add_special=False)[0] != first
