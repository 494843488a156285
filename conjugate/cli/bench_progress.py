"""What `conjugate bench` is doing while a plan is evaluated, on stderr: the stage, the time elapsed
and, the first time a workload meets a GPU, the conventional variants tried and about how long."""
from __future__ import annotations

import time

from rich.progress import Progress, TextColumn, TimeElapsedColumn

from conjugate.cli.console import err, minutes

# one conventional variant built cold (torch.compile), checked and timed: the whole-step variants took
# 57-90 s each on an H200 (benchmarks/README.md, runs 23-24)
VARIANT_TRIAL_S = 90
_STAGE_TEXT = {"setup": "preparing the workload (and, first, measuring the baselines)", "validate": "validating",
               "compile": "compiling", "correctness": "checking against the reference", "timing": "timing"}


def variant_trials_estimate(workload, profile) -> float | None:
    """Seconds the first evaluation spends choosing the conventional variants, where it will (a GPU
    profile wanting torch's baselines, no choice kept for this workload and GPU); None otherwise.
    Says so on stderr."""
    import torch

    if (profile.kind != "gpu" or not {"conventional", "streams"} & set(profile.timing.baselines)
            or not torch.cuda.device_count()):  # no GPU to name: the evaluation says why it cannot measure
        return None
    from conjugate.evaluate.baselines.measure import choice_file

    gpu = torch.cuda.get_device_name(0)
    if choice_file(workload, gpu, profile.timing, None).exists():
        return None
    variants = profile.timing.conventional
    estimate = len(variants) * VARIANT_TRIAL_S
    err.print(f"conventional baseline: no variant chosen yet for {workload.name} on {gpu}; the first evaluation "
              f"builds, checks and times each of {len(variants)} variants ({', '.join(variants)}) first: about "
              f"{minutes(estimate)} (the choice is kept for later runs)")
    return estimate


class BenchProgress:
    """A line on stderr for one plan's evaluation: its stage and the time elapsed; while the workload
    is set up with variants to try, of about how long."""

    def __init__(self, head: str, setup_s: float | None):
        self.head, self.setup_s = head, setup_s
        self.bar = Progress(TextColumn("{task.description}", markup=False), TimeElapsedColumn(), console=err,
                            transient=True)

    def __enter__(self) -> "BenchProgress":
        self.bar.__enter__()
        self.task = self.bar.add_task(f"{self.head}: starting")
        self.started = time.monotonic()
        return self

    def stage(self, stage: str) -> None:
        text = _STAGE_TEXT.get(stage, stage)
        if stage == "setup" and self.setup_s:
            text = f"trying the conventional variants, about {minutes(self.setup_s)} in all"
        self.bar.update(self.task, description=f"{self.head}: {text}")

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)
        if self.setup_s:
            err.print(f"{self.head}: done after {minutes(time.monotonic() - self.started)} "
                      f"(variants estimated at {minutes(self.setup_s)})")
