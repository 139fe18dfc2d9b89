"""The node's queue status (what the render fleet is told) and queue control (pause intent).

Status is a broadcast: every write goes to the fleet (``queue_status/<node>``), and its timestamp
means "last changed", not a heartbeat. So a steady status writes nothing, however often it is
derived; only a forced report (a pause, or an explicit refresh) rewrites an unchanged value.

Pause intent has two scopes: ``all`` (the cluster default) and one per node name. A row takes part
only when its ``paused`` is a real boolean: ``'true'``, 1 or ``{}`` are no opinion, never a pause.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, NamedTuple, cast

Status = Literal["unready", "empty", "queued", "paused"]
UNREADY: Final = "unready"  # the keeper is not serving, or is loading and has found nothing due yet
EMPTY: Final = "empty"  # serving, nothing due
QUEUED: Final = "queued"  # grantable work exists: due, not leased, not held (a claim gets jobs)
PAUSED: Final = "paused"  # the resolved intent is paused
STATUSES: tuple[Status, ...] = (UNREADY, EMPTY, QUEUED, PAUSED)

CLUSTER_SCOPE: Final = "all"
MISSING: Final = object()  # a request that did not say ``paused`` at all


def derive_status(*, paused: bool, serving: bool, loading: bool, due: int) -> Status:
    """What the node should report; ``due`` counts grantable rows (due work that is all in flight
    reads ``empty``: a claim would get nothing). Due work reads ``queued`` even mid-load (a partial
    queue is safe to serve); ``empty`` is never claimed mid-load, when the keeper cannot vouch for it."""
    if paused:
        return PAUSED
    if not serving:
        return UNREADY
    if due > 0:
        return QUEUED
    return UNREADY if loading else EMPTY


class StatusReporter:
    """The node's status flag and when it must be written. Starts ``unready``: a fresh node has
    vouched for nothing."""

    def __init__(self, initial: Status = UNREADY):
        self.status: Status = _checked(initial)

    def report(self, status: Status, *, force: bool | None = None) -> bool:
        """Reference semantics; True when the row must be written. ``force`` defaults to True for
        ``paused``. Forced: set and write, changed or not. Not forced: only move between the
        keeper-derived values (unready, empty, queued) and only on a change; a paused flag never
        moves without force, so lifting a pause must be forced."""
        status = _checked(status)
        if force is None:
            force = status == PAUSED
        if force:
            self.status = status
            return True
        if self.status == PAUSED or status == PAUSED or status == self.status:
            return False
        self.status = status
        return True

    def sync(self, status: Status) -> bool:
        """The keeper's tick: adopt the status it derived from resolved intent and its own state,
        writing only on a change (a steady status, paused included, writes nothing)."""
        status = _checked(status)
        if status == self.status:
            return False
        self.status = status
        return True


def _checked(status: str) -> Status:
    if status not in STATUSES:
        raise ValueError(f"unknown queue status {status!r}; expected one of {', '.join(STATUSES)}")
    return cast(Status, status)


# ------------------------------------------------------------------------------------ pause intent


class PauseIntent(NamedTuple):
    paused: bool
    source: Literal["node", "cluster", "default"]


class PauseWrite(NamedTuple):
    """What a set-pause stored: ``paused`` None means the scope's row was deleted (inherit)."""

    scope: str
    paused: bool | None
    inherited: bool


class PauseRequestError(ValueError):
    def __init__(self, message: str, known_scopes: list[str] | None = None):
        super().__init__(message)
        self.known_scopes = known_scopes


def _opinion(row: Mapping[str, Any] | None) -> bool | None:
    if not isinstance(row, Mapping):
        return None
    paused = row.get("paused")
    return paused if type(paused) is bool else None


def resolve_desired_pause(
    node_row: Mapping[str, Any] | None, cluster_row: Mapping[str, Any] | None
) -> PauseIntent:
    """Node override, else cluster default, else running. Only a real boolean is an opinion."""
    node = _opinion(node_row)
    if node is not None:
        return PauseIntent(node, "node")
    cluster = _opinion(cluster_row)
    if cluster is not None:
        return PauseIntent(cluster, "cluster")
    return PauseIntent(False, "default")


Via = Literal["admin", "fleet"]  # which API wrote a pause intent: the admin's, or the fleet's node route


def fleet_write(row: Mapping[str, Any] | None, paused: bool | None) -> bool | str:
    """Whether the fleet's node route may write ``paused`` (None: delete) over this node's ``row``:
    True, False (nothing to write: the row already pauses it), or why not. A node intent written
    through the admin API is the admin's to change: a fleet credential, shared by many render
    machines, never lifts an admin's pause nor pauses through an admin's explicit run. A row without
    ``via`` (written before it was recorded) counts as the admin's."""
    held = _opinion(row)
    if held is None:
        return True
    row = cast(Mapping[str, Any], row)  # an opinion: a mapping
    if row.get("via") == "fleet":
        return True
    if held and paused is True:
        return False
    who = row.get("updatedBy")
    by = f" by {who}" if isinstance(who, str) and who else ""
    if held:
        return f"this node was paused{by} through the admin API; resume it there (POST /prerender_admin/queue)"
    return f"this node was set to run{by} through the admin API; pause it there (POST /prerender_admin/queue)"


def pause_write(scope: str, paused: Any = MISSING) -> PauseWrite:
    """Normalize a set-pause: None deletes the scope's row (a node inherits ``all`` again; ``all``
    then means running); an absent value is an explicit run (False); anything else is its truth."""
    if paused is None:
        return PauseWrite(scope, None, True)
    return PauseWrite(scope, False if paused is MISSING else bool(paused), False)


def resolve_after_write(
    written: PauseWrite, *, node_scope: str,
    node_row: Mapping[str, Any] | None, cluster_row: Mapping[str, Any] | None,
) -> PauseIntent:
    """Re-resolve right after a write, substituting the normalized value just written for its
    scope (a re-read in the same request can still see the old row); the other scope as read."""
    pending = None if written.paused is None else {"paused": written.paused}
    if written.scope == CLUSTER_SCOPE:
        cluster_row = pending
    elif written.scope == node_scope:
        node_row = pending
    return resolve_desired_pause(node_row, cluster_row)


def validate_admin_pause(
    scope: Any, paused: Any, *, node_scope: str, known_scopes: Iterable[str]
) -> PauseWrite:
    """The admin control request ``{scope, paused}``: scope defaults to this node and must be
    ``all``, this node, a node that has reported a status, or an existing control scope; ``paused`` must be
    true, false or null; ``{scope: all, paused: null}`` is refused (write false to run)."""
    if scope is None:
        scope = node_scope
    if paused is MISSING or (paused is not None and type(paused) is not bool):
        raise PauseRequestError("paused must be true, false or null")
    known = sorted({CLUSTER_SCOPE, node_scope, *known_scopes})
    if not isinstance(scope, str) or scope not in known:
        raise PauseRequestError(f"unknown scope {scope!r}", known)
    if scope == CLUSTER_SCOPE and paused is None:
        raise PauseRequestError("scope 'all' cannot be deleted; set paused to false to run the cluster")
    return pause_write(scope, paused)
