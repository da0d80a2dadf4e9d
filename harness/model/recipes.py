"""A scenario's quantization recipe: what it names, and the config ``mtq.quantize`` takes.

Why: the quarantined jobs do not quantize with the harness's old default. A recipe is named,
never copied: ModelOpt's own objects are loaded by ModelOpt's own code on the rank, so the cell
runs exactly what the installed release ships under that name.

Three forms, each with its prefix (the prefix says who owns the text):
- ``mtq:NVFP4_DEFAULT_CFG``: a ``modelopt.torch.quantization`` config constant;
- ``modelopt:models/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16/ptq/nvfp4-4o6``: a recipe
  of ModelOpt's built-in library (``modelopt_recipes/``), loaded with ``modelopt.recipe.load_recipe``;
- ``file:recipes/mine.yaml``: a user's recipe YAML (same loader), relative to the repository root.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RECIPE = "mtq:NVFP4_DEFAULT_CFG"  # every run before the recipe axis used it
KINDS = ("mtq", "modelopt", "file")
_MTQ_NAME = re.compile(r"^[A-Z][A-Z0-9_]*_CFG$")
_BUILTIN_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


# The amax kinds a recipe's weight quantizers store, per module family: the words the save
# stage records (harness/model/quant.py) and the catalogue uses (harness/check/recipes.py).
SCALAR, STATIC_BLOCK = "scalar", "static-block"
# Kinds whose rules are from source reading only (harness/check/kinds.py):
# static blocks of another format (INT4 AWQ, blockwise weight-only: a per-block _amax, no
# _global_amax), a per-channel axis, MX blocks (e8m0 scales computed at run time, no amax).
PER_BLOCK, PER_CHANNEL, NO_AMAX = "per-block", "per-channel", "no-amax"
EXPERTS, SHARED_EXPERTS, OTHER = "experts", "shared_experts", "other"
# The checkpoint tensors of a weight quantizer of each kind: static NVFP4 keeps a per-block
# ``_amax`` and a scalar ``_global_amax``, each a sharded tensor of its own.
KIND_TENSORS = {SCALAR: ("_amax",), STATIC_BLOCK: ("_amax", "_global_amax"), PER_CHANNEL: ("_amax",),
                PER_BLOCK: ("_amax",), NO_AMAX: ()}


def model_families(shared_experts: bool) -> tuple[str, ...]:
    """The module families a model has: routed experts and dense linears always (attention or
    Mamba projections), shared experts when it has them."""
    return (EXPERTS, SHARED_EXPERTS, OTHER) if shared_experts else (EXPERTS, OTHER)


def module_family(quantizer_name: str) -> str:
    """The module family of a quantizer, by its module path."""
    if ".shared_experts." in quantizer_name:
        return SHARED_EXPERTS
    return EXPERTS if ".experts." in quantizer_name else OTHER


class RecipeError(ValueError):
    """A recipe reference that cannot name a recipe: one line, the constraint it breaks."""


@dataclass(frozen=True)
class Recipe:
    kind: str  # one of KINDS
    target: str  # the constant's name, the built-in path, or the file path

    @property
    def ref(self) -> str:
        return f"{self.kind}:{self.target}"

    @property
    def label(self) -> str:
        """Short name for tables: the constant, or the recipe file's stem."""
        return self.target if self.kind == "mtq" else Path(self.target).stem

    @classmethod
    def parse(cls, text: str) -> "Recipe":
        kind, sep, target = (text or "").partition(":")
        if not sep or kind not in KINDS or not target:
            raise RecipeError(f"{text!r} is not '<kind>:<name>' with kind one of {', '.join(KINDS)} "
                              f"(e.g. {DEFAULT_RECIPE!r})")
        if kind == "mtq" and not _MTQ_NAME.match(target):
            raise RecipeError(f"{text!r}: an mtq recipe names a modelopt.torch.quantization "
                              "constant such as NVFP4_DEFAULT_CFG (upper case, ending in _CFG)")
        if kind == "modelopt" and (not _BUILTIN_PATH.match(target) or ".." in target.split("/")):
            raise RecipeError(f"{text!r}: a modelopt recipe is a path inside ModelOpt's built-in "
                              "recipe library, e.g. models/nvidia/<model>/ptq/<recipe>")
        return cls(kind, target)


@functools.lru_cache(maxsize=None)
def builtin_library() -> Path | None:
    """The installed ``modelopt_recipes`` folder, found without importing ModelOpt (seconds)."""
    spec = importlib.util.find_spec("modelopt_recipes")
    return Path(spec.origin).parent if spec and spec.origin else None


def _builtin_file(target: str, library: Path) -> Path | None:
    for candidate in (library / target, library / f"{target}.yaml", library / f"{target}.yml"):
        if candidate.is_file() or (candidate.is_dir() and (candidate / "quantize.yml").is_file()):
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def _mtq_defined(name: str) -> bool | None:
    """Whether the installed ModelOpt's quantization config defines ``name`` (None: unknown
    here), read from its source so the controller need not import ModelOpt (once per name and
    process: every scenario file without a ``recipe`` asks for the default)."""
    spec = importlib.util.find_spec("modelopt")
    if not spec or not spec.origin:
        return None
    config = Path(spec.origin).parent / "torch" / "quantization" / "config.py"
    if not config.is_file():
        return None
    return re.search(rf"^{re.escape(name)}\b\s*[:=]", config.read_text(), re.M) is not None


def recipe_problem(recipe: Recipe, root: Path) -> str | None:
    """Why the installed ModelOpt (or the repository, for files) has no such recipe, or None.
    Unknown when ModelOpt is not installed here: the rank then says it."""
    if recipe.kind == "file":
        path = root / recipe.target
        return _file_problem(recipe, path) if path.is_file() else \
            f"{recipe.ref}: no such file in the repository"
    if recipe.kind == "mtq":
        if _mtq_defined(recipe.target) is False:
            return f"{recipe.ref}: the installed nvidia-modelopt defines no {recipe.target}"
        return None
    library = builtin_library()
    if library is not None and _builtin_file(recipe.target, library) is None:
        return f"{recipe.ref}: no such recipe in the installed nvidia-modelopt's built-in library"
    return None


def _file_problem(recipe: Recipe, path: Path) -> str | None:
    """What a recipe file must be for ModelOpt's loader (``modelopt.recipe.load_recipe``) and the
    save stage, checked without importing ModelOpt: YAML, whose ``metadata.recipe_type`` is
    ``ptq``, with a ``quantize`` section. Why: a broken file used to fail on every rank, and the
    cells, whose recipe has no rule, were judged rule-unknown: a run that exits 0."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{recipe.ref}: invalid YAML{where}: {getattr(exc, 'problem', None) or exc}"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{recipe.ref}: cannot read ({type(exc).__name__}: {exc})"
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    if not isinstance(meta, dict) or meta.get("recipe_type") != "ptq" or "quantize" not in raw:
        return (f"{recipe.ref}: not a PTQ recipe: ModelOpt's loader needs 'metadata: "
                "{recipe_type: ptq}' and a 'quantize' section")
    return None


def quant_config(recipe: Recipe, root: Path) -> dict:
    """The config dict ``mtq.quantize`` takes, built by ModelOpt itself (on the rank)."""
    if recipe.kind == "mtq":
        import copy

        import modelopt.torch.quantization as mtq

        if not hasattr(mtq, recipe.target):
            raise RecipeError(f"{recipe.ref}: nvidia-modelopt has no {recipe.target}")
        return copy.deepcopy(getattr(mtq, recipe.target))
    from modelopt.recipe import load_recipe

    where = recipe.target if recipe.kind == "modelopt" else str(root / recipe.target)
    loaded = load_recipe(where)
    quantize = getattr(loaded, "quantize", None)
    if quantize is None:
        raise RecipeError(f"{recipe.ref}: not a PTQ recipe (it has no quantize section)")
    return quantize.model_dump()
