"""docs/evidence.md, the page: per job, the baseline, goldens, NCCL, teardown, probes, coverage and the
index of every committed record, from ``Evidence`` (evidence.py); ``main`` writes it with the
README's blocks and docs/records.md's (``python -m harness evidence``)."""
from __future__ import annotations

import json
import re

from harness.paths import BASELINE_QUARANTINE, EVIDENCE_PAGE, README, shown_path
from harness.records import CellRecord, Outcome, Patch
from harness.report import gate
from harness.report import verdict as vd
from harness.report.blocks import with_blocks
from harness.report.evidence import (HEADER, NO_RECORD, NOTHING, Evidence, JobPair, _covers, _link,
                                     readme_blocks, short)
from harness.report.jobs import Quarantine, variant_job
from harness.report.records_index import Pair
from harness.tiers import Tier


# --- the page ---------------------------------------------------------------------------------
def _cell_label(cell_id: str, role: str) -> str:
    inner = cell_id.split("[", 1)[1].rstrip("]")
    inner = re.sub(r"save=[^,]+,", "", inner).replace("load=", "load ")
    return f"{role} {inner}"


def _outcome(jp: JobPair, cell_id: str) -> str:
    if jp.verdict is None:
        return "-"
    e = next(e for e in jp.verdict.evidence if e.cell_id == cell_id)
    return e.outcome


def _job_section(ev: Evidence, job: vd.Job, quarantine: Quarantine, title: str,
                 model: str | None = None) -> list[str]:
    judged = {p: ev.judged(job, p, quarantine) for p in ev.pairs}
    out = [f"### {title}", "", f"{_covers(ev, job, model)}.", "",
           "| pair | verdict | unpatched pipeline | with the fix | the job's cells came from | "
           "interrupted runs among them | cells missing |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for p, jp in judged.items():
        fixed = jp.text(True) if job.profile.fix and gate.fix_runs(p, job, ev.scenarios) else NOTHING
        came = ", ".join(dict.fromkeys(short(s) for s in jp.sources.values())) or "-"
        cut = ", ".join(short(s) for s in jp.interrupted) or "-"
        missing = gate.missing_cells(jp.verdict, p, ev.scenarios) if jp.verdict else []
        n = len(jp.verdict.evidence) if jp.verdict else 0
        miss = NOTHING if not missing else (f"all {len(missing)}" if len(missing) == n else
                                           ", ".join(_cell_label(c, "").strip() for c in missing))
        out.append(f"| {p.modelopt} + {p.mcore} | {jp.verdict.word if jp.verdict else NO_RECORD} | "
                   f"{jp.text(False)} | {fixed} | {came} | {cut} | {miss} |")
    ids = [(e.cell_id, e.role) for e in next(jp.verdict for jp in judged.values() if jp.verdict).evidence]
    out += ["", "| cell (re-judged outcome) | " + " | ".join(f"{p.modelopt} + {p.mcore}" for p in judged) + " |",
            "| --- |" + " --- |" * len(judged)]
    for cid, role in ids:
        out.append(f"| {_cell_label(cid, role)} | " + " | ".join(_outcome(jp, cid) for jp in judged.values()) + " |")
    refused = sorted({t for jp in judged.values() if jp.verdict for t in jp.verdict.refused})
    if refused:
        from harness.check.refusals import SHAPE_REFUSAL_FINDING

        out += ["", f"Known refusal at the reloads {', '.join(refused)}: {SHAPE_REFUSAL_FINDING}."]
    return out + [""]


def _jobs_section(ev: Evidence) -> list[str]:
    out = ["## The jobs' verdicts per pair", "",
           "Each job of scenarios/quarantine.toml judged on every committed record of each "
           "(nvidia-modelopt, megatron-core) pair, as `python -m harness verdict --job ID --gate "
           "--modelopt V --mcore M [--patched]` judges it: for the same cell the newer run wins, "
           "a skipped or interrupted cell never hides a result. `exit N`: the gate's code for a "
           "pipeline without the fix and, where the fix applies to the release, with it. `*`: "
           "the gate opens with a known refusal (below).", ""]
    for job in ev.quarantine.jobs:
        out += _job_section(ev, job, ev.quarantine, f"{job.name} (`{job.id}`)")
        for variant in job.profile.also:
            vjob = variant_job(job, variant)
            out += _job_section(ev, vjob, Quarantine((vjob,)),
                                f"{job.id}, also judged on {variant.model}", variant.model)
    return out


def _baseline_section(ev: Evidence) -> list[str]:
    q = vd.load_quarantine(BASELINE_QUARANTINE)
    out = ["## The baseline profile: `NVFP4_DEFAULT_CFG` on the plain GPT", "",
           f"The jobs judged on the harness's first profile ({shown_path(BASELINE_QUARANTINE)}: "
           "the default recipe, each job's save and its one reload), which most committed runs "
           "were earned with; their own profiles are above.", ""]
    for job in q.jobs:
        out += _job_section(ev, job, q, f"{job.id} on the baseline profile")
    return out


def _brief(rec: CellRecord) -> str:
    """Why a cell without verify figures ended as it did, short: the failed stage and the
    exception's class (and key), or the first words of its reason."""
    if rec.exception_type:
        key = f" on `{rec.failing_key}`" if rec.failing_key else ""
        return f"{rec.failed_stage}: {rec.exception_type.rsplit('.', 1)[-1]}{key}"
    return (rec.reason or "")[:60]


def _golden_section(ev: Evidence) -> list[str]:
    """Each committed golden checkpoint loaded, per pair: the outcome, and what the model held."""
    from harness.check.verify_figures import held_after_load

    out = ["## Existing checkpoints: the committed goldens loaded", "",
           "The checkpoints of tests/golden/ (a 0.46.1 one with a shared amax, 0.47.0 ones saved "
           "at TP == ETP and at TP != ETP without validation, and their repaired copies) loaded "
           "instead of a save; per pair the newest record of each cell. What a release does with "
           "your own checkpoint: `python -m harness inspect CKPT`.", ""]
    from harness.scenario import selections

    patch = {s.name: s.patch for s in ev.scenarios}
    for scenario in selections.listed("evidence", "goldens"):
        how = "loaded with the fix" if patch.get(scenario) == Patch.FIX else "loaded unpatched"
        found: dict[tuple[str, Pair], tuple[str, CellRecord]] = {}
        for label, rec in ev.records():
            if rec.scenario == scenario and rec.outcome not in (Outcome.SKIPPED, Outcome.INTERRUPTED):
                found[(rec.cell_id, Pair(rec.modelopt, rec.mcore))] = (label, rec)
        if not found:
            continue
        pairs = sorted({p for _, p in found}, key=lambda p: p.sort_key)
        cids = sorted({c for c, _ in found})
        out += [f"### {scenario}: {how}", "",
                "| golden -> load | " + " | ".join(f"{p.modelopt} + {p.mcore}" for p in pairs) + " |",
                "| --- |" + " --- |" * len(pairs)]
        for cid in cids:
            texts = []
            for p in pairs:
                if (cid, p) not in found:
                    texts.append("-")
                    continue
                new = ev.rejudged(found[(cid, p)][1])
                what = held_after_load(new.verify) if new.verify else _brief(new)
                texts.append(f"{new.outcome}: {what}" if what else new.outcome)
            head = cid.split("[", 1)[1].rstrip("]").replace("golden=", "").replace(",load=", " -> ")
            out.append(f"| {head} | " + " | ".join(t.replace("|", "/") for t in texts) + " |")
        out.append("")
    return out


def _nccl_section(ev: Evidence) -> list[str]:
    """Every cell run on NCCL ranks sharing a GPU against the newest gloo record of the same
    cell and pair, both re-judged: the same product answer?"""
    from harness.report.equivalence import NOT_COMPARED, SAME_OUTCOME
    from harness.scenario import selections

    gloo: dict = {}
    for label, rec in ev.records():
        if not rec.nccl_mode and rec.outcome not in NOT_COMPARED and rec.tier == Tier.GPU_SHARED:
            gloo[(rec.cell_id, rec.modelopt, rec.mcore)] = (label, rec)
    out = ["## NCCL ranks sharing one GPU, against gloo", "",
           "Tier gpu with each rank its own NCCL host on one GPU (socket transport): each cell "
           "against the newest gloo record of the same cell and pair, both judged by today's "
           "rules; the same answer is the same outcome, exception, failing key and failed stage "
           "(`python -m harness equivalence --outcomes-only --rejudged`).", "",
           "| run | cell | ranks | NCCL | gloo (run) | same answer |", "| --- | --- | --- | --- | --- | --- |"]
    frames = selections.listed("evidence", "teardown")
    for label, rec in ev.records():
        if not rec.nccl_mode or rec.scenario in frames:
            continue
        n = ev.rejudged(rec)
        ranks = re.search(r"(\d+) ranks on (\d+) GPU", rec.nccl_mode)
        nccl = n.outcome + (" (stage timed out)" if n.timed_out else "")
        g = gloo.get((rec.cell_id, rec.modelopt, rec.mcore))
        if g is None:
            out.append(f"| {short(label)} | `{rec.cell_id}` | {ranks.group(1)} | {nccl} | - | - |")
            continue
        gr = ev.rejudged(g[1])
        same = ("not compared (cut)" if n.outcome in NOT_COMPARED else
                "yes" if all(getattr(n, k) == getattr(gr, k) for k in SAME_OUTCOME) else "**no**")
        out.append(f"| {short(label)} | `{rec.cell_id}` | {ranks.group(1)} | {nccl} | "
                   f"{gr.outcome} ({short(g[0])}) | {same} |")
    return out + [""]


def _teardown_section(ev: Evidence) -> list[str]:
    """The injected failures on NCCL ranks: which rank was named, the peers labelled secondary,
    and the seconds from the first failure to every rank gone, per world."""
    from harness.topology.topology import Topology

    from harness.scenario import selections

    frames = selections.listed("evidence", "teardown")
    runs: dict[str, list[CellRecord]] = {}
    for label, rec in ev.records():
        if rec.scenario in frames:
            runs.setdefault(label, []).append(rec)
    worlds = sorted({Topology.parse(r.save_topology).world_size for recs in runs.values() for r in recs})
    out = ["## Teardown on NCCL ranks sharing one GPU", "",
           f"Scenario {', '.join(frames)}: a failure injected at one rank (the run's name says "
           "which: raise or hang, the rank, the stage), every cell failing by design. Per world: "
           "the stage's first failure as named (rank), the peers labelled secondary, and the "
           "seconds from the first failure to every rank gone (`teardown_s`).", "",
           "| run | failed stage: cause | " + " | ".join(f"world {w}" for w in worlds) + " |",
           "| --- | --- |" + " --- |" * len(worlds)]
    for label, recs in runs.items():
        first = recs[0]
        if first.outcome == Outcome.INTERRUPTED:
            what = "interrupted (run stopped)"
        else:
            what = f"{first.failed_stage}: {first.exception_type or ''} " + (
                "stage timeout" if first.timed_out or "timeout" in (first.exception_type or "") else
                (first.message or "").split(";")[0])
        by_world = {Topology.parse(r.save_topology).world_size: r for r in recs}
        texts = []
        for w in worlds:
            r = by_world.get(w)
            if r is None:
                texts.append("-")
                continue
            rank = "" if r.first_failure_rank is None else f"rank {r.first_failure_rank}, "
            secs = "-" if r.teardown_s is None else f"{r.teardown_s:.2f} s"
            texts.append(f"{rank}{len(r.secondary_errors)} secondary, {secs}")
        out.append(f"| {short(label)} | {what.strip()} | " + " | ".join(texts) + " |")
    return out + [""]


def _probe_section(ev: Evidence) -> list[str]:
    """The committed NCCL probes (one all_gather_object timed on NCCL and gloo) and the teardown
    bench's log (bench/teardown.py: which rank it named, the teardown seconds)."""
    out = ["## NCCL probes and the teardown bench", ""]
    probes = sorted(ev.runs_dir.glob("*nccl-probe*.json"))
    if probes:
        out += ["| probe | ranks | NCCL ms per all_gather_object | gloo ms | ModelOpt's check at "
                "the Nano shape, predicted (NCCL) |", "| --- | --- | --- | --- | --- |"]
        for p in probes:
            doc = json.loads(p.read_text())
            steps = doc.get("steps", {})
            nccl = (steps.get("object_gather_nccl_ms") or {}).get("value") or {}
            gloo = (steps.get("object_gather_gloo_ms") or {}).get("value") or {}
            out.append(f"| {p.stem} | {doc.get('world')} | {nccl.get('ms_per_call', '-')} | "
                       f"{gloo.get('ms_per_call', '-')} | {nccl.get('nano_shape_check_s', '-')} s |")
        out.append("")
    line = re.compile(r"== call (\d+), world (\d+)|injected rank (\d+): named rank (\d+) (\S+); "
                      r"secondaries (\d+) all labelled; teardown ([\d.]+) s; right (\w+)")
    for p in sorted(ev.runs_dir.glob("*bench*.txt")):
        out += [f"{p.name} (bench/teardown.py):", "",
                "| call | world | injected rank | named rank (kind) | secondaries labelled | "
                "teardown | named right |", "| --- | --- | --- | --- | --- | --- | --- |"]
        call = world = "?"
        for m in line.finditer(p.read_text()):
            if m.group(1):
                call, world = m.group(1), m.group(2)
                continue
            out.append(f"| {call} | {world} | {m.group(3)} | {m.group(4)} ({m.group(5)}) | "
                       f"{m.group(6)} | {m.group(7)} s | {m.group(8)} |")
        out.append("")
    return out


def _runs_text(names) -> str:
    """Run names, a long list as its count, first and last."""
    names = [short(n) for n in names]
    if len(names) > 4:
        return f"{len(names)} runs, {names[0]} to {names[-1]}"
    return ", ".join(names) or "-"


def _coverage_section(ev: Evidence) -> list[str]:
    from harness.report.coverage import coverage

    items = coverage(ev.runs_dir)
    missing = [i.name for i in items if not i.covered_by]
    out = ["## Not covered yet", "",
           "Recipes and modules of the jobs with no committed GPU cell that ran "
           "(harness/report/coverage.py):", ""]
    out += [f"- {name}" for name in missing] or ["none."]
    out += ["", "| recipe or module | committed runs with a GPU cell that ran it |", "| --- | --- |"]
    out += [f"| {i.name} | {_runs_text(i.covered_by)} |" for i in items]
    return out + [""]


def _index_section(ev: Evidence) -> list[str]:
    out = ["## Every committed record", "",
           "Each file under tests/data/runs/ that holds cells, by the pair its cells name (not its "
           "file name), with its outcomes judged again by today's rules.", "",
           "| record | pair | tier | GPU | cells: re-judged outcomes | interrupted |",
           "| --- | --- | --- | --- | --- | --- |"]
    for e in ev.index:
        counts: dict[str, int] = {}
        for c in e.run.cells:
            o = ev.rejudged(c).outcome
            counts[o] = counts.get(o, 0) + 1
        tiers = ", ".join(sorted({c.tier for c in e.run.cells if c.tier}))
        pairs = ", ".join(f"{p.modelopt} + {p.mcore}" for p in e.pairs)
        outcomes = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
        cut = f"yes ({e.run.interrupted_by})" if e.run.incomplete else ""
        gpu = e.run.version("gpu") or "-"
        out.append(f"| {_link(e.label)} | {pairs} | {tiers} | {gpu} | {len(e.run.cells)}: {outcomes} | {cut} |")
    return out + [""]


def page(ev: Evidence) -> str:
    files = len({e.label.split(" [", 1)[0] for e in ev.index})
    head = [HEADER, "", "# Evidence: every committed record, judged by today's rules", "",
            f"Generated by `python -m harness evidence` from the {files} committed record files "
            "under tests/data/runs/ (results.json, and the per-version cells of matrix.json), "
            "every cell judged again by today's rules (harness/check/rejudge.py); the README's "
            "verdict table is generated with it. Hosts, sessions and timings behind each run: "
            "docs/runs/README.md; what the results mean: docs/findings.md.", ""]
    sections = (_jobs_section, _baseline_section, _golden_section, _nccl_section,
                _teardown_section, _probe_section, _coverage_section, _index_section)
    body = [line for section in sections for line in section(ev)]
    return "\n".join(head + body).rstrip() + "\n"


def main(check: bool = False) -> int:
    """Write docs/evidence.md and the README's generated blocks, and docs/records.md's field
    tables and the records' JSON Schemas (harness/report/records_doc.py); ``check``: write
    nothing, exit 1 naming what differs from what the committed records and types give now."""
    from harness.report.records_doc import wanted

    ev = Evidence()
    want = {EVIDENCE_PAGE: page(ev), README: with_blocks(README.read_text(), readme_blocks(ev)), **wanted()}
    stale = [p for p, text in want.items() if not p.is_file() or p.read_text() != text]
    if check:
        if stale:
            print(f"stale: {', '.join(map(shown_path, stale))}: run python -m harness evidence")
            return 1
        print("docs/evidence.md, the README's and docs/records.md's generated blocks and the "
              "records' JSON Schemas are up to date")
        return 0
    for p in stale:
        p.write_text(want[p])
    stale = [shown_path(p) for p in stale]
    print(f"wrote {', '.join(stale) or 'nothing (up to date)'}")
    return 0
