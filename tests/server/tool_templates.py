"""Chat templates that take tools, written for the tests in the three ways models write
a tool call (Hermes/Qwen's tagged JSON, Llama 3.1's bare JSON with "parameters",
Mistral's control token and JSON list). They are not any model's own template: they
carry only what tool_formats reads (the tools given to the template, and an assistant
turn's calls written the model's way). Also the tools and the question the server's tool
tests ask with."""

HERMES = """
{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

You may call these functions:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": <name>, "arguments": <arguments>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}{% if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA_JSON = """
{%- for m in messages %}<|im_start|>{{ 'ipython' if m.role == 'tool' else m.role }}
{% if loop.first and tools %}Functions you can call, with "name" and "parameters" as JSON:
{% for t in tools %}{{ t.function | tojson }}
{% endfor %}{% endif %}
{%- if m.tool_calls %}{% if m.tool_calls | length != 1 %}{{ raise_exception('one tool call a turn') }}{% endif %}
{{- {"name": m.tool_calls[0].function.name, "parameters": m.tool_calls[0].function.arguments} | tojson }}
{%- else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CONTROL_LIST = """
{%- if tools %}<|im_start|>system
Tools: {{ tools | tojson }}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}<jupyter_code>[
{%- for c in m.tool_calls %}{% if not loop.first %}, {% endif %}
{{- {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
{%- endfor %}]{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls, tools):
    """OpenAI tool_calls (the openai client's objects): each of one of `tools`, its
    arguments valid against that tool's parameters (jsonschema)."""
    import json

    import jsonschema

    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in by_name
        jsonschema.validate(json.loads(c.function.arguments), by_name[c.function.name])
