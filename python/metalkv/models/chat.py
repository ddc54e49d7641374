"""Chat templates: the model's own Jinja2 template (GGUF tokenizer.chat_template,
or tokenizer_config.json / chat_template.jinja in an HF directory), rendered the
way transformers does (sandboxed, trim_blocks, lstrip_blocks), with ChatML as
the fallback for models that carry none."""
from __future__ import annotations

import json
import pathlib
from datetime import datetime
from typing import Any, Mapping, Sequence

CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class ChatPrompt(str):
    """Text a chat template rendered. It already holds every special token the prompt
    needs: templates that want a BOS write `bos_token` themselves (Gemma's, Llama 3's,
    Mistral's), the others want none (Qwen's, Phi-3's). So Tokenizer.encode adds no
    BOS/EOS to it, as transformers' apply_chat_template tokenizes with
    add_special_tokens=False; adding the tokenizer's BOS too gave [bos, bos, ...]
    (issue 31). A ChatPrompt passed through str operations becomes plain text again."""
    __slots__ = ()


class ChatTemplateError(ValueError):
    """The template failed to render (or raised on purpose, e.g. bad role order)."""


def _raise(message: str):
    raise ChatTemplateError(f"[chat] template: {message}")


def _template_parts(content: Any) -> bool:
    """A content list as multimodal templates take it (messages.normalize makes it):
    [{"type": "text", "text": str}, {"type": "image"}, {"type": "audio"}, ...]."""
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and (p.get("type") in ("image", "audio")
                                    or (p.get("type") == "text" and isinstance(p.get("text"), str)))
        for p in content)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = ""):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.is_fallback = not source
        self.source = source or CHATML
        self.bos_token, self.eos_token = bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"[chat] template does not parse: {e} (line {e.lineno})") from None

    @classmethod
    def from_gguf_metadata(cls, md: Mapping[str, Any]) -> "ChatTemplate":
        tokens = md.get("tokenizer.ggml.tokens") or []

        def text(key: str) -> str:
            i = md.get(key)
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

        return cls(md.get("tokenizer.chat_template"), bos_token=text("tokenizer.ggml.bos_token_id"),
                   eos_token=text("tokenizer.ggml.eos_token_id"))

    @classmethod
    def from_hf_dir(cls, path: str | pathlib.Path) -> "ChatTemplate":
        d = pathlib.Path(path)
        cfg: dict[str, Any] = {}
        if (d / "tokenizer_config.json").is_file():
            cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        source = cfg.get("chat_template")
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if not source and (d / "chat_template.jinja").is_file():
            source = (d / "chat_template.jinja").read_text(encoding="utf-8")

        def token_text(v: Any) -> str:
            return v.get("content", "") if isinstance(v, dict) else (v or "")

        return cls(source, bos_token=token_text(cfg.get("bos_token")),
                   eos_token=token_text(cfg.get("eos_token")))

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **extra: Any) -> ChatPrompt:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]; a content may be a
        list of text, image and audio parts, for a template that places media).
        Tokenize it with parse_special=True so the role markers become tokens; the
        tokenizer adds no BOS of its own to it (ChatPrompt)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ChatTemplateError("[chat] messages must be a list of {'role', 'content'} dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) \
                    or not (isinstance(m.get("content"), str) or _template_parts(m.get("content"))):
                raise ChatTemplateError(f"[chat] message {i} must be a dict with str 'role' and 'content' (a str, or "
                                        f"a list of text, image and audio parts), got {m!r:.300}")
        import jinja2

        try:
            return ChatPrompt(self._template.render(messages=[dict(m) for m in messages],
                                                    add_generation_prompt=add_generation_prompt,
                                                    bos_token=self.bos_token, eos_token=self.eos_token,
                                                    **extra))
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"[chat] template failed to render: {e}") from None
