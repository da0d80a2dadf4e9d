"""``python -m harness <command>``: the one entry point (map, run, sample, repro, dump-metadata,
verdict, evidence, report, inspect, repair, matrix, golden): its arguments, and the checks every command
that runs stages makes first. The commands' bodies are harness/commands.py. Rank programs
(harness/rank/) are internal modules."""
from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path

from harness import commands
from harness.paths import RESULTS_DIR, unwritable_dir
from harness.records import PATCHES, Patch
from harness.switches import SwitchError, check_numbers
from harness.tiers import BACKENDS, TIERS, Backend, Tier


# --help's text, as it always read
DESCRIPTION = """``python -m harness <command>``: the one entry point (map, recipes, run, sample, repro,
dump-metadata, verdict, evidence, report, inspect, repair, matrix, golden). Rank programs (harness/rank/) are internal modules."""


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("megatron").setLevel(logging.ERROR)


_USAGE = ("2", "usage: a bad option, value or input file (one line names it)")
_STOPPED = ("128+N", "stopped by signal N (130 Ctrl-C, 143 SIGTERM): the cells so far are in a "
                     "results.json marked incomplete")
_CELLS = [("0", "every cell ran as expected (or was skipped, with its reason)"),
          ("1", "a cell unexpected: unexpected-failure or unexpected-pass"),
          ("2", "usage: a bad or unknown scenario, no cell matches, no cell can run here (each "
                "would be skipped), an unusable --results-root, a bad variable, an untested "
                "megatron-core"), _STOPPED]
# Each command's exit codes, shown as its --help epilog.
EXIT_CODES = {
    "map": [("0", "the map printed"), _USAGE],
    "run": _CELLS,
    "sample": _CELLS,
    "repro": [("0", "the bug and the fix shown as expected"),
              ("1", "a cell unexpected, or (cpu tier) the oracle disagrees with megatron-core's "
                    "real validation or its probe failed"),
              ("2", "usage: --gpu yes without a GPU tier here, an unusable --results-root, a bad "
                    "variable"), _STOPPED],
    "dump-metadata": [("0", "the metadata recorded"), ("1", "the stage failed"),
                      ("2", "usage: a bad topology, or its tier cannot run here")],
    "verdict": [("0", "a verdict that decides (SAFE, SAFE WITH PATCH, BLOCKED) for at least one "
                      "job; with --gate: SAFE, or SAFE WITH PATCH with --patched"),
                ("1", "UNEXPECTED FAILURE"),
                ("2", "usage: an unknown job, a bad results or quarantine file, results of two "
                      "(modelopt, megatron-core) pairs with --gate"),
                ("3", "with --gate: BLOCKED, or SAFE WITH PATCH without --patched"),
                ("4", "nothing decides: INCOMPLETE, NO EVIDENCE or RULE UNKNOWN for every job "
                      "judged (with --job: for it)"),
                ("128+N", "stopped by signal N while running the cells here")],
    "report": [("0", "the summary and picture written"),
               ("2", "no results.json under --results-root, or a bad results file")],
    "equivalence": [("0", "equivalent (--rejudge: the changes printed)"), ("1", "not equivalent"),
                    ("2", "usage: a bad results file, no cell in common, a missing run")],
    "inspect": [("0", "inspected: per-expert, shared or unquantized, no expert amax missing"),
                ("1", "inspected, and the checkpoint needs care: a mixed or incomplete layout, "
                      "or expert amax missing (see `python -m harness repair`)"),
                ("2", "not a megatron-core distributed checkpoint"),
                ("3", "a storage file missing or damaged")],
    "repair": [("0", "written and verified, the dry run printed, or nothing to repair (no DST)"),
               ("1", "the repair failed; DST not written"), ("2", "bad input, or a DST problem"),
               ("3", "SRC damaged")],
    "evidence": [("0", "written, or with --check: the generated files are up to date"),
                 ("1", "with --check: they differ from what the records and types give now"), _USAGE],
    "recipes": [("0", "the table printed"), _USAGE],
    "golden": [("0", "done"), ("2", "a bad golden, manifest or option (one line names it)")],
    "upstream": [("0", "the skeleton written"),
                 ("2", "a missing or bad results file, an unknown or passing cell (one line)")],
    "matrix": [("0", "every pair ran, each cell as its pair's rule says"),
               ("1", "a pair that cannot run, or a cell failed, unexpected or without a rule"),
               ("2", "usage: a bad --modelopt, --mcore or --from")],
}


def _exits(cmd: str) -> dict:
    """add_parser keywords that show the command's exit codes as its --help epilog."""
    rows = [textwrap.fill(meaning, 96, initial_indent=f"  {code:7}", subsequent_indent=" " * 9)
            for code, meaning in EXIT_CODES[cmd]]
    return {"epilog": "exit codes:\n" + "\n".join(rows),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


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


def _add_gate_pair_args(v: argparse.ArgumentParser) -> None:
    """``verdict --job ID --gate --modelopt V [--mcore V]``: the gate finds the committed records
    of that pair by itself (harness/report/records_index.py)."""
    from moe_ckpt_fix.releases import REFERENCE_MCORE

    v.add_argument("--modelopt", metavar="V",
                   help="with --gate: judge every committed record (tests/data/runs/) of "
                        "nvidia-modelopt V, instead of --results")
    v.add_argument("--mcore", metavar="V",
                   help=f"with --modelopt: the megatron-core the job runs (default {REFERENCE_MCORE})")


def _add_evidence_command(sub) -> None:
    """``python -m harness evidence``: docs/evidence.md and the README's generated tables from
    the committed records (harness/report/evidence.py)."""
    e = sub.add_parser("evidence", help="write docs/evidence.md and the README's verdict tables "
                                        "from the committed records, judged again by today's rules, "
                                        "and docs/records.md's field tables and the records' JSON "
                                        "Schemas from the record types",
                       **_exits("evidence"))
    e.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when a generated file (the page, the README's "
                        "blocks, docs/records.md's tables, a JSON Schema) differs from what the "
                        "records and types give now")
    e.set_defaults(fn=commands.cmd_evidence)


def parser() -> argparse.ArgumentParser:
    """Every command, its options and its exit codes (each --help's epilog)."""
    from harness.tiers import STAGE_MODES

    p = argparse.ArgumentParser(prog="python -m harness", description=DESCRIPTION,
                                epilog="exit codes: each command's --help lists its own")
    p.add_argument("--results-root", default=str(RESULTS_DIR))
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("map", help="collision map of every topology up to N ranks (oracle)",
                       **_exits("map"))
    m.add_argument("--max-world", type=bounded_int(1, 64), default=8,
                   help="largest world size (1..64; the map grows fast with it)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=commands.cmd_map)

    r = sub.add_parser("run", help="run scenario cells and print the table", **_exits("run"))
    r.add_argument("--scenario", action="append", default=[],
                   help="scenario name, or the path of its file in scenarios/ (repeatable)")
    rc = sub.add_parser("recipes", help="every recipe the installed ModelOpt ships that quantizes "
                                        "MoE expert weights: forecast amax kinds per family, or "
                                        "ModelOpt's refusal", **_exits("recipes"))
    rc.add_argument("recipe", nargs="*", help="only these references (mtq:NAME, modelopt:PATH, "
                                              "file:PATH); default: the whole library")
    rc.add_argument("--json", action="store_true")
    rc.set_defaults(fn=commands.cmd_recipes)

    r.add_argument("--cells", action="append", default=[],
                   help="glob on cell ids, e.g. '*save=tp4-etp1-ep8*' (repeatable)")
    r.add_argument("--jobs", type=bounded_int(1, 64), default=1,
                   help="cells run at once in each phase (1..64)")
    r.add_argument("--label", default="run", help="suffix of the results/<run-id> folder")
    r.add_argument("--stage-mode", choices=STAGE_MODES, default=None,
                   help="pool: warm rank pools reused by stages of one world size (default on "
                        "tier gpu-shared); fresh: one torchrun per stage (the reference, "
                        "default on tier gpu); fork: each stage's ranks forked from a warm parent "
                        "by torch's elastic launcher (default on tier cpu). Also HARNESS_STAGE_MODE")
    r.add_argument("--nccl-shared-gpu", action="store_true",
                   help="run GPU scenarios as tier gpu with NCCL ranks sharing the GPUs, each rank "
                        "its own NCCL host over loopback sockets (named in every record; cell ids "
                        "unchanged, to compare with the gloo run: `equivalence --outcomes-only`)")
    r.set_defaults(fn=commands.cmd_run)

    sm = sub.add_parser("sample", help="randomized cells the committed grids do not have, run as "
                                       "scenarios", **_exits("sample"))
    sm.add_argument("--seed", type=int, required=True, help="the same seed draws the same cells")
    sm.add_argument("--cells", type=bounded_int(1, 1000), default=50, help="load cells to draw")
    sm.add_argument("--ranks", type=bounded_int(1, 64), default=8,
                    help="rank budget: no topology needs more (default 8: one H200 over gloo)")
    sm.add_argument("--loads-per-save", type=bounded_int(1, 16), default=1,
                    help="loads drawn per (save topology, model size): cells sharing a save share its stage")
    sm.add_argument("--tier", choices=TIERS, default=Tier.GPU_SHARED)
    sm.add_argument("--patch", choices=PATCHES, default=Patch.NONE.value)
    sm.add_argument("--library", default=None, metavar="RELEASE",
                    help="draw each save's recipe from this ModelOpt release's library (its forecast "
                         "file from `harness recipes`) and its optional modules; default: the "
                         "default recipe, no modules")
    sm.add_argument("--slice", default="", metavar="K/N",
                    help="run the K-th of N slices of the draw (whole saves each; the N slices are the draw)")
    sm.add_argument("--list", action="store_true", help="print the drawn cells, run nothing")
    sm.add_argument("--jobs", type=bounded_int(1, 64), help="cells at once per phase (default 1)")
    sm.add_argument("--label", default="", help="suffix of the results/<run-id> folder")
    sm.add_argument("--stage-mode", choices=STAGE_MODES, default=None, help="as for run")
    sm.set_defaults(fn=commands.cmd_sample)

    rp = sub.add_parser("repro", help="the main job: reproduce the bug and check the fix here",
                        **_exits("repro"))
    rp.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto")
    rp.set_defaults(fn=commands.cmd_repro)

    d = sub.add_parser("dump-metadata", help="record sharded-state-dict metadata of a topology",
                       **_exits("dump-metadata"))
    d.add_argument("--topology", required=True)
    d.add_argument("--tier", default=Tier.GPU_SHARED, choices=TIERS)
    d.add_argument("--backend", default=Backend.TE, choices=BACKENDS)
    d.add_argument("--patch", default=Patch.NONE.value, choices=PATCHES)
    d.add_argument("--out", required=True)
    d.set_defaults(fn=commands.cmd_dump)

    v = sub.add_parser("verdict", help="un-quarantine verdict for the two nmm-sandbox jobs",
                       **_exits("verdict"))
    v.add_argument("--results", action="append", default=[],
                   help="results.json to judge (repeatable; default: run the verdict cells)")
    v.add_argument("--job", help="one job of scenarios/quarantine.toml (its id)")
    v.add_argument("--gate", action="store_true",
                   help="exit 0 only when --job may leave quarantine (the codes: below)")
    v.add_argument("--patched", action="store_true",
                   help="with --gate: the job's pipeline applies the fix (installs the moe-ckpt-fix "
                        "wheel of `make fix-wheel` and sets MOE_CKPT_FIX=1)")
    v.add_argument("--quarantine", metavar="FILE",
                   help="the job profiles to judge (default scenarios/quarantine.toml, or "
                        "$HARNESS_QUARANTINE): a job owner's own shapes, recipe and reload grid")
    v.set_defaults(fn=commands.cmd_verdict)
    _add_gate_pair_args(v)

    _add_evidence_command(sub)

    rep = sub.add_parser("report", help="markdown summary + grid picture of a run",
                         **_exits("report"))
    rep.add_argument("results", nargs="?", help="results.json (default: the newest run)")
    rep.set_defaults(fn=commands.cmd_report)

    eq = sub.add_parser("equivalence", help="do two runs of the same cells give the same results?",
                        **_exits("equivalence"))
    eq.add_argument("reference", nargs="?", help="results.json of the reference run (fresh torchrun per stage)")
    eq.add_argument("candidate", nargs="?", help="results.json of the run to check (e.g. --stage-mode pool)")
    eq.add_argument("--rejudge", nargs="+", metavar="RESULTS",
                    help="recorded runs against themselves judged again under today's rules")
    eq.add_argument("--outcomes-only", action="store_true",
                    help="compare only outcome, exception, failing key and failed stage of the "
                         "cells both runs hold (another transport: NCCL against gloo)")
    eq.add_argument("--rejudged", action="store_true",
                    help="judge both runs again under today's rules first (runs recorded under "
                         "older rules, e.g. a gloo run of 2026-12-02 against a new NCCL run)")
    eq.set_defaults(fn=commands.cmd_equivalence)

    up = sub.add_parser("upstream", help="skeleton of a standalone reproducer of a failing cell "
                                         "(docs/upstream.md)", **_exits("upstream"))
    up.add_argument("cell", help="the cell id, as the results file names it")
    up.add_argument("--results", required=True, help="results.json holding the cell")
    up.add_argument("--out", help="write the skeleton here (default: stdout)")
    up.set_defaults(fn=commands.cmd_upstream)

    ins = sub.add_parser("inspect", help="which quantizer layout a checkpoint holds",
                         **_exits("inspect"))
    ins.add_argument("ckpt")
    ins.add_argument("--json", action="store_true", help="the layout and forecast as JSON")
    ins.set_defaults(fn=commands.cmd_inspect)

    rpr = sub.add_parser("repair", help="write a copy of a checkpoint that per-expert releases "
                                        "load complete (offline, no GPU; SRC is not touched)",
                         **_exits("repair"))
    rpr.add_argument("src")
    rpr.add_argument("dst")
    rpr.add_argument("--dry-run", action="store_true", help="print what would be written")
    rpr.set_defaults(fn=commands.cmd_repair)

    g = sub.add_parser("golden", help="golden checkpoints: make (GPU host), write or verify a "
                                      "manifest", **_exits("golden"))
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
    g.set_defaults(fn=commands.cmd_golden)

    mx = sub.add_parser("matrix", help="witness + fix scenarios against several modelopt versions",
                        **_exits("matrix"))
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
    mx.set_defaults(fn=commands.cmd_matrix)
    return p


def idle_option(args) -> str | None:
    """An option that does nothing with the others given: the line refusing it, or None.

    Why: an ignored option reads as a choice made (``verdict --patched`` without ``--gate``
    judged the same as without it)."""
    def given(*pairs) -> str:
        return ", ".join(name for name, value in pairs if value)

    if args.cmd == "verdict" and args.patched and not args.gate:
        return ("--patched needs --gate: it says the job's pipeline applies harness.fix, which only "
                "the gate reads")
    if args.cmd == "equivalence" and args.rejudge:
        idle = given(("REFERENCE/CANDIDATE", args.reference), ("--outcomes-only", args.outcomes_only),
                     ("--rejudged", args.rejudged))
        if idle:
            return (f"{idle}: compare two runs, while --rejudge judges recorded runs against "
                    "themselves; give one or the other")
    if args.cmd == "sample" and args.list:
        idle = given(("--jobs", args.jobs is not None), ("--label", args.label),
                     ("--stage-mode", args.stage_mode))
        if idle:
            return f"{idle}: shape(s) a run, and --list runs nothing"
    return None


def main(argv: list[str] | None = None) -> int:
    from harness.launch.signals import interrupt_on_signals

    _quiet()
    interrupt_on_signals()
    args = parser().parse_args(argv)
    idle = idle_option(args)
    if idle:
        print(f"error: {idle}", file=sys.stderr)
        return 2
    try:
        check_numbers()  # every numeric variable, before any command reads one
        from harness.rank.trim import problem as trim_problem

        if trim_problem():
            print(f"error: {trim_problem()}", file=sys.stderr)
            return 2
        from harness.launch.signals import stopped_code

        return stopped_code(_checked_run(args))
    except SwitchError as exc:  # a yes/no or numeric variable set to another value (switches.py)
        print(f"error: {exc}", file=sys.stderr)
        return 2


def writes_runs(args) -> bool:
    """Whether the command writes run directories under --results-root."""
    return args.cmd in ("run", "repro", "dump-metadata", "matrix") or (
        args.cmd == "sample" and not args.list) or (args.cmd == "verdict" and not args.results)


def _checked_run(args) -> int:
    """The checks every command that runs stages makes first, then the command."""
    if not args.results_root.strip():  # Path("") is the current directory: a run in the checkout
        print("error: --results-root is empty (make: RESULTS=); name a directory, e.g. results",
              file=sys.stderr)
        return 2
    if writes_runs(args):
        why = unwritable_dir(Path(args.results_root))
        if why:
            print(f"error: --results-root {args.results_root}: {why}", file=sys.stderr)
            return 2
        from harness.scenario.scenarios import name_clashes

        for line in name_clashes()[:1]:  # which grid a name picks must not depend on file order
            print(f"error: {line}", file=sys.stderr)
            return 2
    if args.cmd in ("run", "repro", "dump-metadata", "verdict"):
        from harness.machine import version_problem

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
