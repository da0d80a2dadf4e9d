"""One release per version string: a version as the release it belongs to.

megatron-core's ``package_info`` appends the git HEAD of the checkout it is installed in
(``0.19.2+51f9c11``), a build from source may carry a ``.dev`` part: the code is that release's,
and the rules (harness/check/versions.py) and the gate judge releases. A record's ``modelopt`` and
``mcore`` are read as their releases once, where records are written (harness/run/results.py
``write_record``) and where recorded runs are read for judging (harness/report/verdict.py
``doc_records``, for runs written before); the raw strings stay in ``raw_versions``.

Read with ``packaging.version`` (PEP 440): the local label and the dev part go; the epoch, the
release numbers, a pre-release (``rc1``) and a post-release stay (each is its own release). A string
that is not a version is left as it is.
"""
from __future__ import annotations

from dataclasses import replace

from packaging.version import InvalidVersion, Version

from harness.records import CellRecord

# the record's fields and the distributions they name (the keys of ``raw_versions``)
VERSION_FIELDS = (("modelopt", "nvidia-modelopt"), ("mcore", "megatron-core"))


def release(version: str | None) -> str | None:
    """``version`` as the release it belongs to: ``0.19.2+51f9c11`` and ``0.19.2.dev3`` -> ``0.19.2``,
    ``0.48.0rc1+g1234`` -> ``0.48.0rc1``; None, empty or not a version: unchanged."""
    if not version:
        return version
    try:
        v = Version(version)
    except InvalidVersion:
        return version
    out = (f"{v.epoch}!" if v.epoch else "") + ".".join(map(str, v.release))
    if v.pre is not None:
        out += f"{v.pre[0]}{v.pre[1]}"
    if v.post is not None:
        out += f".post{v.post}"
    return out


def as_release(rec: CellRecord) -> CellRecord:
    """``rec`` with its versions read as their releases, the raw strings that differ kept in
    ``raw_versions`` (those it kept already stay); ``rec`` itself when nothing changes."""
    raw = {dist: getattr(rec, name) for name, dist in VERSION_FIELDS
           if getattr(rec, name) and release(getattr(rec, name)) != getattr(rec, name)}
    if not raw:
        return rec
    return replace(rec, modelopt=release(rec.modelopt), mcore=release(rec.mcore),
                   raw_versions={**raw, **(rec.raw_versions or {})})
