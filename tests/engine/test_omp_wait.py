"""The engine child's OpenMP spin setting: set unless the operator chose one."""

from __future__ import annotations

from engine.process.omp_wait import (
    ENGINE_GOMP_SPINCOUNT,
    engine_child_environment,
    omp_wait_settings,
)


def test_the_engine_child_spins_briefly_and_keeps_the_rest_of_the_environment() -> None:
    env = engine_child_environment({"PATH": "/bin", "MIXGATE_X": "1"})
    assert env == {"PATH": "/bin", "MIXGATE_X": "1", "GOMP_SPINCOUNT": str(ENGINE_GOMP_SPINCOUNT)}


def test_an_operators_own_openmp_wait_setting_is_kept() -> None:
    assert engine_child_environment({"GOMP_SPINCOUNT": "300000"})["GOMP_SPINCOUNT"] == "300000"
    passive = engine_child_environment({"OMP_WAIT_POLICY": "PASSIVE"})
    assert passive == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert omp_wait_settings({"GOMP_SPINCOUNT": "0"}) == {}
    assert omp_wait_settings({}) == {"GOMP_SPINCOUNT": str(ENGINE_GOMP_SPINCOUNT)}


def test_the_parents_mapping_is_not_changed() -> None:
    parent = {"PATH": "/bin"}
    engine_child_environment(parent)
    assert parent == {"PATH": "/bin"}
