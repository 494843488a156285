"""lab/experiments/overlap_bound.py's parts that need no GPU: which launches make each phase, the plan
each workload takes by default, and the launches in order on one stream."""
from __future__ import annotations

import pytest

from conjugate.graph import build_graph
from conjugate.paths import EXAMPLES_DIR, shipped_plan
from conjugate.plan import load_plan
from conjugate.plan.expand import expand
from conjugate.workload import load_workload
from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

bound = load_script("overlap_bound")
TINY = EXAMPLES_DIR / "tiny.toml"


def _schedule(plan: str):
    w = load_workload(TINY)
    return expand(load_plan(shipped_plan(plan)), w, build_graph(w))


def test_each_phase_is_its_models_launches_in_order():
    schedule = _schedule("sequential")
    draft, target = (bound.phase_launches(schedule, m) for m in bound.MODELS)
    assert draft and target and sorted(draft + target) == list(range(len(schedule.launches)))
    assert all(p.model.value == "draft" for i in draft for p in schedule.launches[i].parts)
    assert draft == sorted(draft) and max(draft) < min(target)  # sequential: the draft's phase first


def test_a_shared_launch_has_no_phase():
    with pytest.raises(SystemExit, match="holds both models' ops"):
        bound.phase_launches(_schedule("interleave"), "draft")


def test_one_stream_runs_the_launches_in_order_and_the_default_plan_is_the_best_plans_phases_apart():
    ran = []
    bound.dealt([lambda i=i: ran.append(i) for i in range(5)], 1, None)()
    assert ran == [0, 1, 2, 3, 4]
    path = bound.default_plan(EXAMPLES_DIR / "qwen3-06b-8b-b4.toml")
    assert path.is_file() and path.name == "best-phases-apart.json" and path.parent.name == "qwen3-06b-8b-b4"
