"""Kill-mid-save: processes saving checkpoints are SIGKILLed; nothing complete is ever lost.

21 random kills (7 per mode: overwrite, fresh paths, CheckpointManager) of a
worker saving an ~8 MiB state, plus one death at each step of the commit
protocol. ``benchmarks/kill_mid_save.py`` runs the same with 200 trials of ~100 MB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _ckpt_kill

TRIALS = 21
MB = 8


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return _ckpt_kill.run(TRIALS, MB, tmp_path_factory.mktemp("kill"), seed=1)


@pytest.mark.slow
def test_every_checkpoint_that_loads_is_complete_and_nothing_complete_is_lost(outcomes):
    problems = [(o.mode, o.die_at, p) for o in outcomes for p in o.problems]
    assert problems == [], _ckpt_kill.summary(outcomes)
    random_kills = [o for o in outcomes if not o.die_at]
    assert len(random_kills) >= 20
    assert {o.mode for o in random_kills} == set(_ckpt_kill.MODES)
    # The kills really land inside saves, after earlier saves completed.
    assert sum(o.mid_save for o in random_kills) >= len(random_kills) // 2
    assert all(o.completed >= 1 and o.loaded for o in random_kills)


# What must be on disk after a death at each step of the commit protocol
# (version 0 is complete before the worker dies saving version 1, or step 2 for the
# manager, whose max_to_keep=2 prunes step 0 once step 2 is in place).
EXPECTED = {
    ("overwrite", "rename1"): [0],  # new one complete, old not yet moved aside: old
    ("overwrite", "rename2"): [1],  # between the renames: the complete new one
    ("overwrite", "drop"): [1],  # new in place, old not yet deleted
    ("manager", "rename1"): [0],  # step 1 complete but not renamed in: step 0
    ("manager", "rename2"): [0, 1],  # step 2 complete but not renamed in
    ("manager", "drop"): [1, 2],  # step 0 hidden for deletion, not yet deleted
}


@pytest.mark.parametrize("mode, die_at", list(EXPECTED))
def test_death_at_each_commit_step_leaves_the_expected_checkpoints(outcomes, mode, die_at):
    (outcome,) = [o for o in outcomes if (o.mode, o.die_at) == (mode, die_at)]
    assert outcome.problems == []
    assert outcome.loaded == EXPECTED[mode, die_at]
