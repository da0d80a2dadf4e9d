"""docs/records.md's field tables and the records' JSON Schemas, generated from the record types
(harness/records.py, harness/golden/manifest.py) by ``python -m harness evidence``.

Why: the tables were kept by hand and lacked fields, and the manifest's schema file was
stricter than the code and read by nothing. Each field's meaning is written once, in its
``described`` metadata; tests/test_records_doc.py fails when a type changes and these files
are not regenerated.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path

from pydantic import TypeAdapter

from harness.golden.manifest import Manifest
from harness.paths import MANIFEST_SCHEMA, RECORDS_PAGE, RECORDS_SCHEMA
from harness.records import CellRecord, ProbeRecord, RunResults, StageCause, StageResult

# docs/records.md's generated block -> the type whose fields it lists
TABLES = {"results-fields": RunResults, "cell-fields": CellRecord, "probe-fields": ProbeRecord,
          "stage-fields": StageResult, "cause-fields": StageCause, "manifest-fields": Manifest}
# schema file -> (the type, its title)
SCHEMAS = {RECORDS_SCHEMA: (RunResults, "moe-ckpt-harness results.json: a run and its cells "
                                        "(harness/records.py RunResults)"),
           MANIFEST_SCHEMA: (Manifest, "moe-ckpt-harness golden checkpoint manifest "
                                       "(harness/golden/manifest.py Manifest)")}


def json_schema(tp: type, title: str) -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **TypeAdapter(tp).json_schema(), "title": title}


def _type(prop: dict, defs: dict) -> str:
    """A property's JSON Schema type in words: `a` | `b` for an enum, ``or`` for a union."""
    if "$ref" in prop:
        target = defs[prop["$ref"].rsplit("/", 1)[-1]]
        if "enum" in target:
            return " \\| ".join(f"`{v}`" for v in target["enum"])
        return target.get("title", "object")
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and "patternProperties" in prop:
        (keys, value), = prop["patternProperties"].items()
        return f"object: `{keys}` -> {_type(value, defs)}"
    text = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
            "null": "null", "object": "object"}.get(kind, kind)
    return text + (f" matching `{prop['pattern']}`" if "pattern" in prop else "")


def _default(f) -> str:
    if f.default is not MISSING:
        return f"`{json.dumps(f.default)}`"
    if f.default_factory is not MISSING:
        return f"`{json.dumps(f.default_factory())}`"
    return "required"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(cls: type) -> str:
    """One row per field: name, type, default (``required`` when written always), meaning."""
    schema = TypeAdapter(cls).json_schema()
    defs, props = schema.get("$defs", {}), schema["properties"]
    rows = [f"| `{f.name}` | {_type(props[f.name], defs)} | {_default(f)} | "
            f"{_cell(f.metadata['description'])} |" for f in fields(cls)]
    return "\n".join(["| field | type | default | meaning |", "| --- | --- | --- | --- |", *rows])


def wanted() -> dict[Path, str]:
    """Every file generated from the record types -> the text it must hold."""
    from harness.report.blocks import with_blocks

    out = {path: json.dumps(json_schema(tp, title), indent=1) + "\n"
           for path, (tp, title) in SCHEMAS.items()}
    out[RECORDS_PAGE] = with_blocks(RECORDS_PAGE.read_text(),
                                    {name: table(cls) for name, cls in TABLES.items()}, RECORDS_PAGE.name)
    return out
