"""What a generate call is asked for besides its prompt: metalkv.Sampling (how tokens
are drawn, speculative decoding's options), stop strings, and the check that a draft
model speaks the target's tokens. The checks themselves are the C++ engine's
(_core.check_generate), so Python and C++ cannot disagree."""
from __future__ import annotations

from dataclasses import dataclass, fields

from . import _core
from .constrain import grammar_of
from .errors import argument_error
from .models import LoadedModel, ModelLoadError


@dataclass(frozen=True)
class Sampling:
    """How a generate call draws its tokens. The defaults the CLI shows and uses;
    max_tokens's and the checks of every value are the C++ engine's
    (_core.DEFAULT_MAX_TOKENS, _core.check_generate), so Python and C++ cannot disagree."""
    max_tokens: int = _core.DEFAULT_MAX_TOKENS
    temperature: float = 0.0          # 0 = greedy
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0                # 1 = off
    min_p: float = 0.0                # 0 = off
    repetition_penalty: float = 1.0   # 1 = off
    presence_penalty: float = 0.0     # 0 = off
    frequency_penalty: float = 0.0    # 0 = off
    seed: int | None = None           # None: a fresh random seed per call
    speculate: str | None = None      # 'lookup' (prompt lookup) or 'draft' (the draft model)
    draft_tokens: int | None = None   # ids proposed per step (None: 4)
    # constrained decoding (metalkv.constrain, docs/CONSTRAINED.md)
    logit_bias: dict | None = None    # {token id: bias in [-100, 100]}, added to the logits
    response_format: dict | None = None  # OpenAI's: {"type": "json_object"} or a "json_schema"
    grammar: object = None            # a metalkv.Grammar, or a GBNF or Lark grammar's text

    @classmethod
    def of(cls, options: dict, what: str) -> "Sampling":
        unknown = set(options) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"{what}() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
        return cls(**options).check()

    def check(self) -> "Sampling":
        """Raises metalkv.ArgumentError (a ValueError naming the argument); compiles the
        call's grammar, if any (a bad one names its field and the position)."""
        _core.check_generate(**self._core_kwargs(0 if self.seed is None else self.seed))
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise argument_error("generate", "logit_bias", self.logit_bias, "None or a dict {token id: bias}")
        object.__setattr__(self, "_grammar", grammar_of(self.response_format, self.grammar))
        return self

    def _core_kwargs(self, seed: int) -> dict:
        kw = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _CONSTRAINED}
        kw["seed"] = seed
        return kw

    @property
    def constrained(self) -> bool:
        return getattr(self, "_grammar", None) is not None

    def constraint_kwargs(self, llg_tokenizer) -> dict:
        """Engine._core.submit's logit_bias and constraint (a fresh matcher a call);
        llg_tokenizer() gives llguidance's tokenizer when a grammar needs it."""
        kw = {"logit_bias": self.logit_bias}
        if self.constrained:
            kw["constraint"] = self._grammar.matcher(llg_tokenizer())
        return kw


_CONSTRAINED = ("logit_bias", "response_format", "grammar")


def check_draft(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft model proposes ids the target verifies: the ids must mean the same tokens.
    Raises ModelLoadError naming the first difference."""
    a, b = target.config.vocab, draft.config.vocab
    if a != b:
        raise ModelLoadError(f"{draft.path}: the draft model has {b} token ids, {target.path.name} has {a}; "
                             f"a draft model needs the same vocabulary")
    ta, tb = target.tokenizer, draft.tokenizer
    if ta is None or tb is None:
        return  # token ids only: the same count is all there is to check
    for i in range(a):
        if ta.id_to_token(i) != tb.id_to_token(i):
            raise ModelLoadError(f"{draft.path}: token id {i} is {tb.id_to_token(i)!r} for the draft model and "
                                 f"{ta.id_to_token(i)!r} for {target.path.name}; a draft model needs the same "
                                 f"tokenizer")


def _check_stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise argument_error("generate", "stop", stop, "a non-empty str or a list of them")
    return list(stops)
