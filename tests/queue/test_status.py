"""Queue status and queue control, ``unready`` included (docs/queue.md#queue-status-and-control)."""

from __future__ import annotations

from typing import Any

import pytest

from prerender_ray.queue.status import (
    CLUSTER_SCOPE,
    EMPTY,
    MISSING,
    PAUSED,
    QUEUED,
    UNREADY,
    PauseIntent,
    PauseRequestError,
    PauseWrite,
    StatusReporter,
    derive_status,
    fleet_write,
    pause_write,
    resolve_after_write,
    resolve_desired_pause,
    validate_admin_pause,
)

NODE = "node-a"


def test_a_paused_intent_short_circuits_derivation() -> None:
    assert derive_status(paused=True, serving=False, loading=True, due=5) == PAUSED


def test_the_node_is_unready_until_the_keeper_serves() -> None:
    assert derive_status(paused=False, serving=False, loading=False, due=0) == UNREADY
    # a dead keeper does not report queued forever
    assert derive_status(paused=False, serving=False, loading=False, due=10) == UNREADY


def test_empty_is_never_reported_mid_load() -> None:
    assert derive_status(paused=False, serving=True, loading=True, due=0) == UNREADY
    assert derive_status(paused=False, serving=True, loading=True, due=3) == QUEUED  # partial queues serve


def test_only_grantable_work_is_queued() -> None:
    # the count is of grantable rows (the keeper's published ready set): work all in flight is empty
    assert derive_status(paused=False, serving=True, loading=False, due=1) == QUEUED
    assert derive_status(paused=False, serving=True, loading=False, due=0) == EMPTY


def test_a_fresh_reporter_is_unready() -> None:
    assert StatusReporter().status == UNREADY


def test_a_steady_status_writes_nothing() -> None:
    r = StatusReporter(QUEUED)
    assert [r.report(QUEUED) for _ in range(5)] == [False] * 5
    assert [r.sync(QUEUED) for _ in range(5)] == [False] * 5


def test_a_real_change_writes_in_both_directions() -> None:
    r = StatusReporter(EMPTY)
    assert r.report(QUEUED) is True and r.status == QUEUED
    assert r.report(EMPTY) is True and r.status == EMPTY


def test_a_forced_refresh_writes_an_unchanged_status() -> None:
    r = StatusReporter(QUEUED)
    assert r.report(QUEUED, force=True) is True and r.status == QUEUED


def test_paused_is_forced_by_default_and_rewritten() -> None:
    r = StatusReporter(QUEUED)
    assert r.report(PAUSED) is True and r.status == PAUSED
    assert r.report(PAUSED) is True


def test_an_unforced_report_never_moves_a_paused_flag() -> None:
    r = StatusReporter(PAUSED)
    assert r.report(EMPTY) is False and r.report(QUEUED) is False and r.report(UNREADY) is False
    assert r.status == PAUSED


def test_lifting_a_pause_is_forced_and_leaves_paused() -> None:
    r = StatusReporter(PAUSED)
    assert r.report(QUEUED, force=True) is True
    assert r.status == QUEUED


def test_unforced_reports_move_between_the_keeper_derived_values() -> None:
    r = StatusReporter()
    assert r.report(QUEUED) is True and r.status == QUEUED
    assert r.report(UNREADY) is True and r.status == UNREADY
    assert r.report(EMPTY) is True and r.status == EMPTY


def test_the_keeper_sync_writes_only_on_change_and_may_lift_a_pause() -> None:
    r = StatusReporter()
    assert r.sync(UNREADY) is False
    assert r.sync(QUEUED) is True
    assert r.sync(PAUSED) is True
    assert [r.sync(PAUSED) for _ in range(3)] == [False] * 3  # a steady pause is not rebroadcast
    assert r.sync(EMPTY) is True and r.status == EMPTY


def test_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError):
        StatusReporter("busy")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StatusReporter().report("busy")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StatusReporter().sync("busy")  # type: ignore[arg-type]


def test_the_cluster_scope_is_all() -> None:
    assert CLUSTER_SCOPE == "all"


def test_no_control_rows_means_running_by_default() -> None:
    assert resolve_desired_pause(None, None) == PauseIntent(False, "default")


def test_a_cluster_row_applies_without_a_node_override() -> None:
    assert resolve_desired_pause(None, {"paused": True}) == PauseIntent(True, "cluster")
    assert resolve_desired_pause({}, {"paused": False}) == PauseIntent(False, "cluster")


def test_a_node_override_wins_both_ways() -> None:
    assert resolve_desired_pause({"paused": False}, {"paused": True}) == PauseIntent(False, "node")
    assert resolve_desired_pause({"paused": True}, {"paused": False}) == PauseIntent(True, "node")


@pytest.mark.parametrize("junk", ["true", 1, {}, [], None, "false", 0, "yes"])
def test_a_non_boolean_paused_never_pauses_and_falls_through(junk: Any) -> None:
    assert resolve_desired_pause({"paused": junk}, None) == PauseIntent(False, "default")
    assert resolve_desired_pause({"paused": junk}, {"paused": True}) == PauseIntent(True, "cluster")
    assert resolve_desired_pause(None, {"paused": junk}) == PauseIntent(False, "default")


def test_a_scalar_projection_is_no_opinion() -> None:
    assert resolve_desired_pause(True, True) == PauseIntent(False, "default")  # type: ignore[arg-type]


def test_an_absent_paused_is_written_as_an_explicit_run() -> None:
    assert pause_write(NODE) == PauseWrite(NODE, False, False)
    assert pause_write(NODE, MISSING) == PauseWrite(NODE, False, False)


def test_null_deletes_the_row_and_reports_inherited() -> None:
    assert pause_write(NODE, None) == PauseWrite(NODE, None, True)


def test_a_written_value_is_its_truth() -> None:
    assert pause_write(CLUSTER_SCOPE, True) == PauseWrite(CLUSTER_SCOPE, True, False)
    assert pause_write(CLUSTER_SCOPE, 0) == PauseWrite(CLUSTER_SCOPE, False, False)


def test_resume_substitutes_the_deleted_override_over_a_stale_read() -> None:
    intent = resolve_after_write(pause_write(NODE, None), node_scope=NODE,
                                 node_row={"paused": True}, cluster_row={"paused": False})
    assert intent == PauseIntent(False, "cluster")


def test_pause_substitutes_the_written_value_over_a_stale_read() -> None:
    intent = resolve_after_write(pause_write(NODE, True), node_scope=NODE, node_row={"paused": False},
                                 cluster_row=None)
    assert intent == PauseIntent(True, "node")


def test_a_cluster_write_under_a_node_override_keeps_the_override() -> None:
    intent = resolve_after_write(pause_write(CLUSTER_SCOPE, True), node_scope=NODE,
                                 node_row={"paused": False}, cluster_row={"paused": False})
    assert intent == PauseIntent(False, "node")
    intent = resolve_after_write(pause_write(CLUSTER_SCOPE, True), node_scope=NODE, node_row=None,
                                 cluster_row={"paused": False})
    assert intent == PauseIntent(True, "cluster")


def test_a_write_for_another_node_reads_both_scopes() -> None:
    other = pause_write("node-b", True)
    intent = resolve_after_write(other, node_scope=NODE, node_row=None, cluster_row={"paused": True})
    assert intent == PauseIntent(True, "cluster")
    intent = resolve_after_write(other, node_scope=NODE, node_row=None, cluster_row=None)
    assert intent == PauseIntent(False, "default")


def test_the_admin_request_defaults_to_this_node() -> None:
    assert validate_admin_pause(None, True, node_scope=NODE, known_scopes=[]) == PauseWrite(NODE, True, False)
    assert validate_admin_pause(CLUSTER_SCOPE, False, node_scope=NODE, known_scopes=[]) == PauseWrite(
        CLUSTER_SCOPE, False, False)
    assert validate_admin_pause("node-b", None, node_scope=NODE, known_scopes=["node-b"]) == PauseWrite(
        "node-b", None, True)


@pytest.mark.parametrize("paused", ["true", 1, 0, {}, MISSING])
def test_the_admin_request_needs_true_false_or_null(paused: Any) -> None:
    with pytest.raises(PauseRequestError, match="true, false or null"):
        validate_admin_pause(NODE, paused, node_scope=NODE, known_scopes=[])


def test_an_unknown_scope_is_refused_with_the_known_ones() -> None:
    with pytest.raises(PauseRequestError) as err:
        validate_admin_pause("node-z", True, node_scope=NODE, known_scopes=["node-b"])
    assert err.value.known_scopes == ["all", "node-a", "node-b"]
    with pytest.raises(PauseRequestError):
        validate_admin_pause(5, True, node_scope=NODE, known_scopes=[])


def test_the_cluster_scope_cannot_be_deleted() -> None:
    with pytest.raises(PauseRequestError, match="false"):
        validate_admin_pause(CLUSTER_SCOPE, None, node_scope=NODE, known_scopes=[])


def test_the_fleet_writes_over_no_row_its_own_row_or_no_opinion() -> None:
    for row in (None, {}, {"paused": "true"}, {"paused": True, "via": "fleet", "updatedBy": "renderer"}):
        assert fleet_write(row, True) is True and fleet_write(row, None) is True


def test_an_admins_pause_is_the_admins_to_lift() -> None:
    admin = {"paused": True, "updatedBy": "ops", "via": "admin"}
    refused = fleet_write(admin, None)  # the fleet's resume
    assert isinstance(refused, str) and "paused by ops through the admin API" in refused
    assert fleet_write(admin, True) is False  # already paused: nothing to write, not an error
    legacy = {"paused": True, "updatedBy": "ops"}  # written before `via` was recorded: the admin's
    assert isinstance(fleet_write(legacy, None), str)


def test_an_admins_explicit_run_is_not_paused_by_the_fleet() -> None:
    run = {"paused": False, "updatedBy": "ops", "via": "admin"}
    for paused in (True, None):  # a pause, or a resume that would delete it (inherit a cluster pause)
        refused = fleet_write(run, paused)
        assert isinstance(refused, str) and "set to run by ops" in refused
