"""A cell's pytest item and the run's exit code agree on every outcome: `make test-gpu` fails
exactly where `python -m harness run` exits 1. A known refusal or a recipe ModelOpt refuses
for the model passes both (the nightly failed them while the run passed them); what decides
nothing (rule-unknown, blocked, skipped) is a named skip; an unexpected outcome fails both."""
from __future__ import annotations

import pytest

from harness.outcomes import (GOOD_OUTCOMES, PASSING_OUTCOMES, UNDECIDED_OUTCOMES,
                             UNEXPECTED_OUTCOMES, Outcome)
from harness.run.results import exit_code


def test_every_outcome_has_one_place():
    placed = [*PASSING_OUTCOMES, *UNDECIDED_OUTCOMES, *UNEXPECTED_OUTCOMES, Outcome.INTERRUPTED]
    assert sorted(placed) == sorted(Outcome), "an outcome with no place, or with two"
    assert set(GOOD_OUTCOMES) <= set(PASSING_OUTCOMES)


@pytest.mark.parametrize("outcome", [o for o in Outcome if o != Outcome.INTERRUPTED])
def test_the_test_fails_exactly_where_the_run_exits_1(outcome):
    run_fails = exit_code({"cells": [{"outcome": outcome.value}]}) == 1
    test_fails = outcome not in (*PASSING_OUTCOMES, *UNDECIDED_OUTCOMES)
    assert run_fails == test_fails, outcome
