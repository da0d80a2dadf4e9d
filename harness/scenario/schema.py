"""What a scenario file (``scenarios/*.toml``) may say, and a bad file's one line.

Why: a scenario file is plain data a non-Python reader can follow; a mistake in it must come
back as one line naming the file, the key and the constraint, in the words of a TOML file.
"""
from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Annotated, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model

from harness.check.logits import LOGITS_REFERENCES
from harness.fix import PARTS
from harness.model.checkpoint import DEFAULT_STRICTNESS
from harness.model.gpt import ModelSize
from harness.model.modules import (HYBRID_PATTERN_RE, HYBRID_PATTERN_RULE, KINDS, POSITION_EMBEDDINGS,
                                   SCORE_FUNCTIONS)
from harness.model.recipes import DEFAULT_RECIPE
from harness.records import EXPECT_MODES, PATCHES, ExpectMode, Patch
from harness.tiers import BACKENDS, TIERS




class ScenarioError(ValueError):
    """One bad scenario file, as one line: ``<file>: <key>: <constraint>``.

    ``path`` and ``name`` (the scenario's name, or the file's stem) let callers show or select it.
    """

    def __init__(self, message: str, path: Path | None = None, name: str | None = None):
        super().__init__(" ".join(str(message).split()))  # one line, whatever the cause said
        self.path = path
        self.name = name



NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # scenario and golden names end up in ids and paths


MARKER_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"


_NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit"


Name = Annotated[str, Field(pattern=NAME_RE)]


Text = Annotated[str, Field(min_length=1)]



class _Schema(BaseModel):
    # strict: TOML gives real types, so "300" for a number or "tp1" for a list is a mistake
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _KnownGapSchema(_Schema):
    pattern: Text
    reason: Text


# [model]: any ModelSize field; a size is a positive integer, an optional module
# (harness/model/modules.py) takes the type and values megatron-core gives it.
_MODULE_TYPES = {
    "kind": Literal[KINDS],
    "hybrid_layer_pattern": Annotated[str, Field(pattern=HYBRID_PATTERN_RE)],
    "moe_router_score_function": Literal[SCORE_FUNCTIONS],
    "moe_router_enable_expert_bias": bool,
    "position_embedding_type": Literal[POSITION_EMBEDDINGS],
}
_SizeSchema = create_model(
    "_SizeSchema", __base__=_Schema,
    **{f.name: (Optional[_MODULE_TYPES.get(f.name, Annotated[int, Field(gt=0)])], None)
       for f in dataclasses.fields(ModelSize)})


class _ScenarioSchema(_Schema):
    name: Optional[Name] = None
    description: str = ""
    tier: Literal[TIERS]
    backend: Literal[BACKENDS]
    patch: Literal[PATCHES] = Patch.NONE.value
    # patch "fix" only: the parts of the fix the scenario's proof needs (moe_ckpt_fix PARTS)
    fix_parts: list[Literal[tuple(PARTS)]] = []
    recipe: Text = DEFAULT_RECIPE
    shared_gpu_nccl: bool = False
    expect: Literal[EXPECT_MODES] = ExpectMode.ORACLE.value
    markers: list[Annotated[str, Field(pattern=MARKER_RE)]] = []
    saves: list[str] = []
    loads: list[str] = []
    pairs: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = []
    goldens: list[Name] = []
    singleton_local_shards: bool = True
    strict_load: bool = True
    # how the load reads the checkpoint, as the jobs do (harness/model/checkpoint.py)
    dist_ckpt_strictness: Text = DEFAULT_STRICTNESS
    megatron_lm_load: bool = False
    logits_reference: Literal[LOGITS_REFERENCES] = "save-topology"
    known_gaps: list[_KnownGapSchema] = []
    stage_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    model: Optional[_SizeSchema] = None



_CHOICES = {"tier": TIERS, "backend": BACKENDS, "patch": PATCHES, "expect": EXPECT_MODES,
            "logits_reference": LOGITS_REFERENCES, "kind": KINDS,
            "moe_router_score_function": SCORE_FUNCTIONS, "fix_parts": tuple(PARTS)}


_PATTERN_RULES = {NAME_RE: _NAME_RULE, HYBRID_PATTERN_RE: HYBRID_PATTERN_RULE}


_TOML_TYPE = {str: "string", bool: "boolean", int: "integer", float: "float", list: "array",
              dict: "table"}


_WANTED = {"string_type": "a string", "bool_type": "true or false", "int_type": "an integer",
           "float_type": "a number", "list_type": "an array", "dict_type": "a table",
           "model_type": "a table"}



def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _table_schema(annotation) -> type[BaseModel] | None:
    """The table schema inside a field's type (``T``, ``Optional[T]``, ``list[T]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_table_schema, get_args(annotation))), None)


def _keys_at(loc: tuple, top: type[BaseModel]) -> list[str]:
    """The keys allowed in the table at ``loc`` (for 'did you mean'): the schema met walking
    ``loc`` down from ``top``."""
    schema = top
    for part in (p for p in loc if not isinstance(p, int)):
        field = schema.model_fields.get(part)
        sub = _table_schema(field.annotation) if field else None
        if sub is None:
            break
        schema = sub
    return list(schema.model_fields)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(err: dict, top: type[BaseModel] = _ScenarioSchema) -> str:
    """One pydantic error -> ``key: constraint`` in the words of a TOML file."""
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    where, ctx = _loc(loc), err.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _keys_at(loc[:-1], top)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{where}: unknown key ({hint}allowed: {', '.join(allowed)})"
    if kind == "missing":
        return f"{where}: required key missing"
    if kind == "literal_error":  # a list's item: the list's key names the choices
        choices = _CHOICES.get(next((p for p in reversed(loc) if not isinstance(p, int)), None))
        allowed = ", ".join(choices) if choices else ctx.get("expected", "")
        close = difflib.get_close_matches(str(value), choices or (), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{where}: {_shown(value)} is not one of {allowed}{' (' + hint.strip() + ')' if hint else ''}"
    if kind in _WANTED:
        got = _TOML_TYPE.get(type(value), type(value).__name__)
        return f"{where}: expected {_WANTED[kind]}, got {got} {_shown(value)}"
    if kind == "string_pattern_mismatch":
        rule = _PATTERN_RULES.get(ctx.get("pattern"), f"a name matching {ctx.get('pattern')}")
        return f"{where}: {_shown(value)} must be {rule}"
    if kind == "string_too_short":
        return f"{where}: must not be empty"
    if kind == "greater_than":
        return f"{where}: must be > {ctx.get('gt')}, got {_shown(value)}"
    if kind == "finite_number":
        return f"{where}: must be a finite number, got {_shown(value)}"
    if kind in ("too_short", "too_long") and loc[0] == "pairs":
        return f"{where}: expected [save, load], got {_shown(value)}"
    if kind == "too_short":
        return f"{where}: must hold at least {ctx.get('min_length')} item(s)"
    return f"{where}: {err.get('msg', kind)} (got {_shown(value)})"
