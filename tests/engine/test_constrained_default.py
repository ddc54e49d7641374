"""Constrained decoding on the default model (SmolLM2-135M-Instruct): each of the 30
schemas of json_schemas.py once, every third one sampled and the others greedy (the same
grammars' masks under both; each schema both ways took another 70 s of CI), in one
batched call per mode; every reply must parse and validate with jsonschema (the
independent reference), and end because the JSON was complete, not at max_tokens.
Skipped without the default model (CI installs it)."""
import json

import pytest

from .json_schemas import SCHEMAS

jsonschema = pytest.importorskip("jsonschema", reason="the test extra's jsonschema is not installed")


SAMPLED = SCHEMAS[::3]
GREEDY = [s for i, s in enumerate(SCHEMAS) if i % 3]


@pytest.mark.parametrize("sampling, schemas", [(dict(temperature=0.0), GREEDY),
                                               (dict(temperature=0.8, top_p=0.95, seed=11), SAMPLED)],
                         ids=["greedy", "sampled"])
def test_every_reply_validates_against_its_schema(engine, sampling, schemas):
    """The calls run together (Engine.start on one channel: batched steps, each call
    its own matcher and mask rows)."""
    from metalkv import _core
    from metalkv._calls import drive

    channel = _core.Channel()
    calls = [engine.start(q + " Reply in JSON.", channel=channel, chat=True, max_tokens=160,
                        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s}},
                        **sampling)
             for i, (q, s) in enumerate(schemas)]
    for _ in drive(calls, channel, on_interrupt="abort"):
        pass
    for (q, schema), call in zip(schemas, calls):
        text = "".join(call.text)
        assert call.request.finish_reason == "stop", (q, text)
        jsonschema.validate(json.loads(text), schema)
