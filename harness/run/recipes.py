"""The recipe survey (harness/rank/recipe_survey.py) run in a process of its own, bounded in
time: it builds the cpu tier's model and calibrates every recipe the installed ModelOpt ships."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.bounded import run
from harness.paths import REPO_ROOT
from harness.rank.recipe_survey import PREFIX

SURVEY_MODULE = "harness.rank.recipe_survey"
SURVEY_TIMEOUT_S = 1800.0


def survey(refs: list[str], timeout_s: float = SURVEY_TIMEOUT_S) -> dict:
    """The survey's document, from a process of its own (it builds a model and calibrates)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = run([sys.executable, "-m", SURVEY_MODULE, *refs], timeout_s, cwd=REPO_ROOT, env=env,
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = next((l for l in (done.stdout or "").splitlines() if l.startswith(PREFIX)), None)
    if done.timed_out or done.returncode != 0 or line is None:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the recipe survey {'timed out' if done.timed_out else 'failed'} "
                           f"(exit {done.returncode}): {tail[0]}")
    return json.loads(line[len(PREFIX):])


