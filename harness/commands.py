"""The bodies of ``python -m harness <command>`` (harness/cli.py parses the arguments): each
takes the parsed arguments and returns the exit code; the work lives in the packages."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def cmd_map(args) -> int:
    from harness.topology.oracle import collision_map

    entries = collision_map(args.max_world)
    if args.json:
        print(json.dumps([e.as_json() for e in entries], indent=1))
        return 0
    from harness.topology.collision_map import render_map

    print(render_map(entries))
    return 0


def cmd_recipes(args) -> int:
    """Every recipe the installed ModelOpt ships that quantizes routed-expert weights
    (harness/rank/recipe_survey.py), as a table (harness/report/recipes.py) or JSON."""
    from harness.check.versions import installed_mcore, installed_modelopt, rules_for
    from harness.report.recipes import table
    from harness.rank.recipe_survey import in_own_process

    try:
        doc = in_own_process(args.recipe)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # a recipe named on the command line that is none (unknown name, missing file): refused, not
    # a table of 0 with it under "Left out" and exit 0 (a recipe that quantizes no expert is one)
    unknown = [r for r in doc["rows"] if r["recipe"] in args.recipe and "algorithm" not in r]
    if unknown:
        print(f"error: recipe {unknown[0]['recipe']}: {unknown[0]['left_out']}", file=sys.stderr)
        return 2
    if not args.recipe:  # the whole library: the forecast the judge falls back on (check/matching.py)
        from harness.check.matching import write

        write(doc)
    print(json.dumps(doc, indent=1) if args.json else table(doc, rules_for(installed_modelopt(), installed_mcore())))
    return 0


def cmd_run(args) -> int:
    from harness.run.cells import none_can_run, run_cells, select_cells
    from harness.scenario.scenarios import (ScenarioError, load_all_with_errors, report_errors,
                                            scenario_name)

    good, bad = load_all_with_errors()
    report_errors(bad)  # reported and skipped: one bad file never blocks the others
    try:
        asked = {scenario_name(a, good, bad) for a in args.scenario}
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if any({err.name, Path(err.path).stem} & asked for err in bad):
        return 2  # the scenario asked for is a bad one
    scenarios = [s for s in good if not asked or s.name in asked]
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
    if none_can_run(cells):
        print(f"error: {none_can_run(cells)}", file=sys.stderr)
        return 2
    if args.stage_mode:  # read by harness/launch/pool.py stage_mode(), the one place
        os.environ["HARNESS_STAGE_MODE"] = args.stage_mode
    doc = run_cells(cells, Path(args.results_root), label=args.label, jobs=args.jobs)
    from harness.run.results import exit_code

    return exit_code(doc)


def cmd_sample(args) -> int:
    """Randomized cells off the committed grid (harness/scenario/sample.py), run as scenarios."""
    from harness.run.cells import none_can_run, run_cells
    from harness.scenario.sample import describe, parse_slice, sample_scenarios, slice_of

    try:
        scenarios = sample_scenarios(args.seed, args.cells, max_ranks=args.ranks, tier=args.tier,
                                     patch=args.patch, loads_per_save=args.loads_per_save,
                                     library=args.library)
        if args.slice:
            scenarios = slice_of(scenarios, *parse_slice(args.slice))
    except ValueError as exc:
        print(f"error: harness sample: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print(describe(scenarios))
        return 0
    if args.stage_mode:
        os.environ["HARNESS_STAGE_MODE"] = args.stage_mode
    cells = [c for s in scenarios for c in s.cells()]
    if none_can_run(cells):
        print(f"error: {none_can_run(cells)}", file=sys.stderr)
        return 2
    label = args.label or f"sample-s{args.seed}-{args.patch}"
    doc = run_cells(cells, Path(args.results_root), label=label, jobs=args.jobs or 1)
    from harness.run.results import exit_code

    return exit_code(doc)


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

    given = ("--quarantine " if getattr(args, "quarantine", None) else
             f"{QUARANTINE_ENV}=" if os.environ.get(QUARANTINE_ENV) else "")  # who named the file
    if getattr(args, "quarantine", None):  # every later load_quarantine takes this file
        os.environ[QUARANTINE_ENV] = args.quarantine
    try:
        verdict.cells_to_run()  # the profile file read and checked, each job's scenarios too
    except ProfileError as exc:
        print(f"error: {given}{exc}", file=sys.stderr)
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
    if getattr(args, "modelopt", None) or getattr(args, "mcore", None):
        return _gate_committed(args)
    if args.results:
        from harness.check.results_file import ResultsFileError

        try:
            docs = verdict.read_docs(args.results)
        except ResultsFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return gate.EXIT_USAGE
        return _judge(args, docs)
    from harness.run.cells import run_cells
    from harness.machine import tier_skip_reason

    cells = verdict.cells_to_run()
    if all(tier_skip_reason(c.scenario.tier, c.world) for c in cells):
        if args.gate:  # the gate judges evidence given or named (--results, --modelopt)
            print(verdict_text.no_evidence_line(cells[0].scenario.tier))
            return gate.EXIT_UNDECIDED
        from harness.report import committed_verdict  # nothing runs here: the committed evidence

        return committed_verdict.main(cells[0].scenario.tier, args.job)
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


def _gate_committed(args) -> int:
    """``verdict --job ID --gate --modelopt V [--mcore V] [--patched]``: the gate on every
    committed record of that pair (harness/report/gate.py main_committed); refused in one line
    without --gate, without --modelopt, or beside --results."""
    from harness.report import gate

    try:
        if not args.modelopt:  # --mcore alone: name it, not the --modelopt never given
            raise gate.GateUsage("--mcore needs --modelopt V (and --gate --job ID): with it, the "
                                 "gate picks the committed records of that pair")
        if not args.gate:
            raise gate.GateUsage("--modelopt needs --gate (and --job ID): it picks the committed "
                                 "records the gate judges")
        if args.results:
            raise gate.GateUsage("give --modelopt (the committed records of a pair) or "
                                 "--results, not both")
        return gate.main_committed(args.job, args.modelopt, args.mcore, args.patched)
    except gate.GateUsage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return gate.EXIT_USAGE


def cmd_evidence(args) -> int:
    from harness.report.evidence_page import main as evidence_main

    return evidence_main(check=args.check)


def cmd_report(args) -> int:
    from harness.report.picture import main as report_main

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


def cmd_upstream(args) -> int:
    """The skeleton of a standalone reproducer of one failing cell (harness/report/upstream.py)."""
    from harness.report.upstream import SkeletonError, skeleton

    try:
        text = skeleton(Path(args.results), args.cell)
    except SkeletonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.out:
        sys.stdout.write(text)
        return 0
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0
