"""The first shard task runs alone for a moment, then one per core, then more as tasks finish."""

from __future__ import annotations

from teibatch.pipeline.ramp import FIRST_TASK_ALONE_S, TASKS_ADDED_PER_FINISH, TaskRamp


def test_the_first_task_runs_alone_then_one_per_core() -> None:
    ramp = TaskRamp(limit=10, cores=4, started=100.0)
    assert ramp.allowed == 1
    assert ramp.seconds_to_change(100.25) == FIRST_TASK_ALONE_S - 0.25
    ramp.tick(100.0 + FIRST_TASK_ALONE_S / 2)
    assert ramp.allowed == 1
    ramp.tick(100.0 + FIRST_TASK_ALONE_S)
    assert ramp.allowed == 4
    assert ramp.seconds_to_change(200.0) is None


def test_a_task_finishing_early_hands_its_worker_to_the_next_one() -> None:
    ramp = TaskRamp(limit=10, cores=4, started=0.0)
    ramp.task_finished(FIRST_TASK_ALONE_S / 2)  # no new worker process while the first chunks go out
    assert ramp.allowed == 1
    ramp.task_finished(FIRST_TASK_ALONE_S)
    assert ramp.allowed == 4 + TASKS_ADDED_PER_FINISH


def test_on_several_machines_the_first_tasks_start_together() -> None:
    ramp = TaskRamp(limit=10, cores=4, started=0.0, alone_s=0.0)
    assert ramp.allowed == 4 and ramp.seconds_to_change(0.0) is None


def test_never_more_than_the_limit_nor_fewer_than_one() -> None:
    ramp = TaskRamp(limit=3, cores=16, started=0.0)
    ramp.tick(FIRST_TASK_ALONE_S)
    assert ramp.allowed == 3
    for _ in range(5):
        ramp.task_finished(10.0)
    assert ramp.allowed == 3
    single = TaskRamp(limit=0, cores=0, started=0.0)
    single.tick(FIRST_TASK_ALONE_S)
    assert single.allowed == 1 and single.seconds_to_change(FIRST_TASK_ALONE_S) is None
