"""``python -m harness <command>``: the one entry point (map, run, sample, repro, dump-metadata,
verdict, report, inspect, repair, matrix, golden). Rank programs (harness/rank/) are internal modules."""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from harness.paths import RESULTS_DIR
from harness.records import PATCHES, Patch
from harness.tiers import BACKENDS, TIERS, Backend, Tier


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("megatron").setLevel(logging.ERROR)


def cmd_map(args) -> int:
    from harness.topology.oracle import collision_map

    entries = collision_map(args.max_world)
    if args.json:
        print(json.dumps([e.as_json() for e in entries], indent=1))
        return 0
    from harness.topology.collision_map import render_map

    print(render_map(entries))
    return 0


def cmd_run(args) -> int:
    from harness.run.cells import run_cells, select_cells
    from harness.scenario.scenarios import load_all_with_errors, report_errors

    good, bad = load_all_with_errors()
    report_errors(bad)  # reported and skipped: one bad file never blocks the others
    if any({err.name, Path(err.path).stem} & set(args.scenario) for err in bad):
        return 2  # the scenario asked for is a bad one
    scenarios = [s for s in good if not args.scenario or s.name in args.scenario]
    if args.nccl_shared_gpu:
        from harness.scenario.scenarios import as_nccl_shared

        variants = [as_nccl_shared(s) for s in scenarios]
        for why in (v for v in variants if isinstance(v, str)):
            print(f"scenario skipped: {why}", file=sys.stderr)  # the others go on
        scenarios = [v for v in variants if not isinstance(v, str)]
    cells = select_cells(scenarios, args.cells)
    if not cells:
        print(f"no cell matches scenario {args.scenario} / cells {args.cells}; "
              "see scenarios/*.toml", file=sys.stderr)
        return 2
    if args.stage_mode:  # read by harness/launch/pool.py stage_mode(), the one place
        import os

        os.environ["HARNESS_STAGE_MODE"] = args.stage_mode
    doc = run_cells(cells, Path(args.results_root), label=args.label, jobs=args.jobs)
    from harness.run.results import exit_code

    return exit_code(doc)


def cmd_sample(args) -> int:
    """Randomized cells off the committed grid (harness/scenario/sample.py), run as scenarios."""
    from harness.run.cells import run_cells
    from harness.scenario.sample import describe, parse_slice, sample_scenarios, slice_of

    try:
        scenarios = sample_scenarios(args.seed, args.cells, max_ranks=args.ranks, tier=args.tier,
                                     patch=args.patch, loads_per_save=args.loads_per_save)
        if args.slice:
            scenarios = slice_of(scenarios, *parse_slice(args.slice))
    except ValueError as exc:
        print(f"error: harness sample: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print(describe(scenarios))
        return 0
    if args.stage_mode:
        import os

        os.environ["HARNESS_STAGE_MODE"] = args.stage_mode
    cells = [c for s in scenarios for c in s.cells()]
    label = args.label or f"sample-s{args.seed}-{args.patch}"
    doc = run_cells(cells, Path(args.results_root), label=label, jobs=args.jobs)
    from harness.run.results import exit_code

    return exit_code(doc)


def bounded_int(low: int, high: int):
    """An argparse type: an int in [low, high], else one clear line (no silent default)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value
    return parse


def cmd_repro(args) -> int:
    from harness.run.repro import repro

    return repro(Path(args.results_root), gpu=args.gpu)


def cmd_dump(args) -> int:
    from harness.run.cells import dump_metadata
    from harness.topology.topology import Topology, TopologyError

    try:
        topo = Topology.parse(args.topology).check()
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return dump_metadata(topo, args.tier, args.backend, args.patch, Path(args.out),
                         Path(args.results_root))


def cmd_verdict(args) -> int:
    """Judge the given results.json files, or run the quarantined jobs' cells here first; with
    ``--gate``, one job's verdict as the gate's exit code (harness/report/gate.py)."""
    from harness.report import gate, verdict, verdict_text
    from harness.report.jobs import QUARANTINE_ENV, ProfileError

    if getattr(args, "quarantine", None):  # every later load_quarantine takes this file
        os.environ[QUARANTINE_ENV] = args.quarantine
    try:
        verdict.load_quarantine()
    except (OSError, ProfileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return gate.EXIT_USAGE
    try:
        if args.gate and not args.job:
            known = ", ".join(j.id for j in verdict.load_quarantine().jobs)
            raise gate.GateUsage(f"--gate needs --job ID; known jobs: {known}")
        if args.job:
            gate.job_of(args.job)
    except gate.GateUsage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return gate.EXIT_USAGE
    if args.results:
        from harness.check.results_file import ResultsFileError

        try:
            docs = verdict.read_docs(args.results)
        except ResultsFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return gate.EXIT_USAGE
        return _judge(args, docs)
    from harness.run.cells import run_cells
    from harness.scenario.machine import tier_skip_reason

    cells = verdict.cells_to_run()
    if all(tier_skip_reason(c.scenario.tier, c.world) for c in cells):
        print(verdict_text.no_evidence_line(cells[0].scenario.tier))  # nothing could run here
        return gate.EXIT_UNDECIDED if args.gate else 0
    print(f"running {len(cells)} verdict cell(s) with the installed modelopt", file=sys.stderr)
    doc = run_cells(cells, Path(args.results_root), label="verdict", out=sys.stderr)
    from harness.run.results import exit_code

    rc = _judge(args, [("this machine, installed modelopt", doc)])
    return exit_code(doc) if doc.get("incomplete") else rc


def _judge(args, docs) -> int:
    from harness.report import gate, verdict_text

    if not args.gate:
        return verdict_text.main(docs, args.job)
    try:
        return gate.main(docs, args.job, args.patched)
    except gate.GateUsage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return gate.EXIT_USAGE


def cmd_report(args) -> int:
    from harness.report.summary import main as report_main

    return report_main(args)


def cmd_equivalence(args) -> int:
    from harness.report.equivalence import main as equivalence_main

    return equivalence_main(args)


def cmd_inspect(args) -> int:
    from harness.golden.inspect import main as inspect_main

    return inspect_main(args)


def cmd_repair(args) -> int:
    from harness.golden.repair import main as repair_main

    return repair_main(args)


def cmd_golden(args) -> int:
    from harness.golden.manifest import GoldenError, verify_manifest, write_manifest
    from harness.run.golden import make_golden

    try:
        if args.golden_cmd == "make":
            print(make_golden(args.dir, topology=args.topology,
                       validate_sharding=args.validate_sharding == "true", tier=args.tier,
                       notes=args.notes))
        elif args.golden_cmd == "repair":
            from harness.golden.repair import repair_golden
            from harness.golden.repair_plan import NothingToRepair, RepairError

            try:
                print(repair_golden(args.dir, args.dst))
            except NothingToRepair as exc:
                print(exc)  # no new golden: it would equal its source
            except RepairError as exc:
                raise GoldenError(str(exc)) from None
        elif args.golden_cmd == "write":
            print(write_manifest(args.dir, topology=args.topology, made_by=args.made_by,
                                 layout=args.layout, notes=args.notes))
        else:
            doc = verify_manifest(args.dir)
            print(f"{args.dir}: {len(doc['files'])} files verified")
    except GoldenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_matrix(args) -> int:
    from harness.run.matrix import main as matrix_main

    return matrix_main(args)


def main(argv: list[str] | None = None) -> int:
    from harness.tiers import STAGE_MODES
    from harness.launch.signals import interrupt_on_signals

    _quiet()
    interrupt_on_signals()
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    p.add_argument("--results-root", default=str(RESULTS_DIR))
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("map", help="collision map of every topology up to N ranks (oracle)")
    m.add_argument("--max-world", type=bounded_int(1, 64), default=8,
                   help="largest world size (1..64; the map grows fast with it)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=cmd_map)

    r = sub.add_parser("run", help="run scenario cells and print the table")
    r.add_argument("--scenario", action="append", default=[], help="scenario name (repeatable)")
    r.add_argument("--cells", action="append", default=[],
                   help="glob on cell ids, e.g. '*save=tp4-etp1-ep8*' (repeatable)")
    r.add_argument("--jobs", type=bounded_int(1, 64), default=1,
                   help="cells run at once in each phase (1..64)")
    r.add_argument("--label", default="run", help="suffix of the results/<run-id> folder")
    r.add_argument("--stage-mode", choices=STAGE_MODES, default=None,
                   help="pool: warm rank pools reused by stages of one world size (default on "
                        "tiers cpu and gpu-shared); fresh: one torchrun per stage (the reference, "
                        "default on tier gpu). Also HARNESS_STAGE_MODE")
    r.add_argument("--nccl-shared-gpu", action="store_true",
                   help="run GPU scenarios as tier gpu with NCCL ranks sharing the GPUs, each rank "
                        "its own NCCL host over loopback sockets (named in every record; cell ids "
                        "unchanged, to compare with the gloo run: `equivalence --outcomes-only`)")
    r.set_defaults(fn=cmd_run)

    sm = sub.add_parser("sample", help="randomized cells the committed grids do not have, run as scenarios")
    sm.add_argument("--seed", type=int, required=True, help="the same seed draws the same cells")
    sm.add_argument("--cells", type=bounded_int(1, 1000), default=50, help="load cells to draw")
    sm.add_argument("--ranks", type=bounded_int(1, 64), default=8,
                    help="rank budget: no topology needs more (default 8: one H200 over gloo)")
    sm.add_argument("--loads-per-save", type=bounded_int(1, 16), default=1,
                    help="loads drawn per (save topology, model size): cells sharing a save share its stage")
    sm.add_argument("--tier", choices=TIERS, default=Tier.GPU_SHARED)
    sm.add_argument("--patch", choices=PATCHES, default=Patch.NONE.value)
    sm.add_argument("--slice", default="", metavar="K/N",
                    help="run the K-th of N slices of the draw (whole saves each; the N slices are the draw)")
    sm.add_argument("--list", action="store_true", help="print the drawn cells, run nothing")
    sm.add_argument("--jobs", type=bounded_int(1, 64), default=1, help="cells at once per phase")
    sm.add_argument("--label", default="", help="suffix of the results/<run-id> folder")
    sm.add_argument("--stage-mode", choices=STAGE_MODES, default=None, help="as for run")
    sm.set_defaults(fn=cmd_sample)

    rp = sub.add_parser("repro", help="the main job: reproduce the bug and check the fix here")
    rp.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto")
    rp.set_defaults(fn=cmd_repro)

    d = sub.add_parser("dump-metadata", help="record sharded-state-dict metadata of a topology")
    d.add_argument("--topology", required=True)
    d.add_argument("--tier", default=Tier.GPU_SHARED, choices=TIERS)
    d.add_argument("--backend", default=Backend.TE, choices=BACKENDS)
    d.add_argument("--patch", default=Patch.NONE.value, choices=PATCHES)
    d.add_argument("--out", required=True)
    d.set_defaults(fn=cmd_dump)

    v = sub.add_parser("verdict", help="un-quarantine verdict for the two nmm-sandbox jobs")
    v.add_argument("--results", action="append", default=[],
                   help="results.json to judge (repeatable; default: run the verdict cells)")
    v.add_argument("--job", help="one job of scenarios/quarantine.toml (its id)")
    v.add_argument("--gate", action="store_true",
                   help="exit 0 only when --job may leave quarantine: 0 SAFE (or SAFE WITH PATCH "
                        "with --patched), 1 UNEXPECTED FAILURE, 2 usage, 3 BLOCKED, 4 INCOMPLETE "
                        "/ NO EVIDENCE / RULE UNKNOWN")
    v.add_argument("--patched", action="store_true",
                   help="with --gate: the job's pipeline applies harness.fix (MOE_CKPT_FIX=1)")
    v.add_argument("--quarantine", metavar="FILE",
                   help="the job profiles to judge (default scenarios/quarantine.toml, or "
                        "$HARNESS_QUARANTINE): a job owner's own shapes, recipe and reload grid")
    v.set_defaults(fn=cmd_verdict)

    rep = sub.add_parser("report", help="markdown summary + grid picture of a run")
    rep.add_argument("results", nargs="?", help="results.json (default: the newest run)")
    rep.set_defaults(fn=cmd_report)

    eq = sub.add_parser("equivalence", help="do two runs of the same cells give the same results?")
    eq.add_argument("reference", nargs="?", help="results.json of the reference run (fresh torchrun per stage)")
    eq.add_argument("candidate", nargs="?", help="results.json of the run to check (e.g. --stage-mode pool)")
    eq.add_argument("--rejudge", nargs="+", metavar="RESULTS",
                    help="recorded runs against themselves judged again under today's rules")
    eq.add_argument("--outcomes-only", action="store_true",
                    help="compare only outcome, exception, failing key and failed stage of the "
                         "cells both runs hold (another transport: NCCL against gloo)")
    eq.set_defaults(fn=cmd_equivalence)

    ins = sub.add_parser("inspect", help="which quantizer layout a checkpoint holds")
    ins.add_argument("ckpt")
    ins.add_argument("--json", action="store_true", help="the layout and forecast as JSON")
    ins.set_defaults(fn=cmd_inspect)

    rpr = sub.add_parser("repair", help="write a copy of a checkpoint that per-expert releases "
                                        "load complete (offline, no GPU; SRC is not touched)")
    rpr.add_argument("src")
    rpr.add_argument("dst")
    rpr.add_argument("--dry-run", action="store_true", help="print what would be written")
    rpr.set_defaults(fn=cmd_repair)

    g = sub.add_parser("golden", help="golden checkpoints: make (GPU host), write or verify a manifest")
    gsub = g.add_subparsers(dest="golden_cmd", required=True)
    gm = gsub.add_parser("make", help="save stage + manifest (GPU host; not run on CPU)")
    gm.add_argument("dir")
    gm.add_argument("--topology", required=True)
    gm.add_argument("--validate-sharding", choices=("true", "false"), default="true")
    gm.add_argument("--tier", default=Tier.GPU_SHARED, choices=TIERS)
    gm.add_argument("--notes", default="")
    gw = gsub.add_parser("write", help="manifest for a checkpoint made elsewhere")
    gw.add_argument("dir")
    gw.add_argument("--topology", required=True)
    gw.add_argument("--made-by", required=True)
    gw.add_argument("--layout", default="")
    gw.add_argument("--notes", default="")
    gr = gsub.add_parser("repair", help="repair a golden (python -m harness repair) into a new "
                                        "golden directory with its manifest")
    gr.add_argument("dir")
    gr.add_argument("dst")
    gv = gsub.add_parser("verify", help="every file's sha256 against the manifest")
    gv.add_argument("dir")
    g.set_defaults(fn=cmd_golden)

    mx = sub.add_parser("matrix", help="witness + fix scenarios against several modelopt versions")
    mx.add_argument("--modelopt", action="append", default=[],
                    help="a release (0.48.0rc1), a local wheel file, or git:<ref> (docker "
                         "image); repeatable; default: every version harness/check/versions.py knows")
    mx.add_argument("--mcore", action="append", default=[],
                    help="a megatron-core release (0.16.1) or series (0.15.x: its newest tested "
                         "patch); repeatable; one environment per (modelopt, mcore) pair; "
                         "default: the reference 0.19.2")
    mx.add_argument("--from", dest="from_runs", action="append", default=[],
                    help="an earlier matrix run directory (or its matrix.json) to include; "
                         "alone: render those rows without running anything")
    mx.set_defaults(fn=cmd_matrix)

    args = p.parse_args(argv)
    if args.cmd in ("run", "repro", "dump-metadata", "verdict"):
        from harness.scenario.machine import version_problem

        problem = version_problem()
        if problem and problem.fatal:
            print(f"error: {problem.line}", file=sys.stderr)
            return 2
        if problem:
            print(f"warning: {problem.line}", file=sys.stderr)
        if not getattr(args, "stage_mode", None):  # --stage-mode overrides the variable
            from harness.launch.pool import stage_mode

            try:
                stage_mode()
            except ValueError as exc:  # one line, not a traceback from the first stage
                print(f"error: {exc}", file=sys.stderr)
                return 2
    return args.fn(args)
