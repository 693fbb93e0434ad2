"""`LocalJob`: what a replica knows of one job it holds a lease on, from claim to the end of its
task; the dispatcher (`gateway.dispatch.dispatcher`) keeps them, the job runner
(`gateway.dispatch.job_run`) runs them."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.dispatch.local_delivery import Listener, Route
from gateway.queue import ClaimedJob
from gateway.queue.payload import JobPayload
from policies.request_class import RequestClass


@dataclass(slots=True, eq=False)
class LocalJob:
    """A job this replica holds a lease on, from its claim until its task ends."""

    claimed: ClaimedJob
    # A cancel message or flag named it: abort, then complete as cancelled.
    cancel_requested: bool = False
    # renew said stale: another replica holds the job now; abort and write nothing more.
    fenced: bool = False
    # Drain: aborted here, and the dispatcher returns the lease to the queue; write nothing.
    handed_back: bool = False
    # Generation is over and complete() is under way: no longer abortable, and a stale renew
    # may just mean that our own complete() landed.
    finishing: bool = False
    # Where this attempt's events go (decided at its first event) and, when local, to whom.
    route: Route | None = None
    listener: Listener | None = None
    # The parsed request, once run() read it.
    payload: JobPayload | None = None
    # Admitted straight into running here (`Dispatcher.admit_here`), not claimed from a queue.
    started_here: bool = False
    # After a handover from the local route: the index of the next event's explicit id (the
    # stream goes on numbering where the in-process ids stopped); None: Redis picks ids.
    next_event_index: int | None = None
    # The engine has given it a token: its prompt is done (`Dispatcher` paces bulk claims on
    # the jobs that have not).
    made_tokens: bool = False

    def __post_init__(self) -> None:
        # Flagged before the claim (the claim script reads the flag): it raced the claim.
        self.cancel_requested = self.cancel_requested or self.claimed.cancel_requested

    @property
    def job_id(self) -> str:
        return self.claimed.job.job_id

    @property
    def token(self) -> int:
        return self.claimed.lease_token

    @property
    def request_class(self) -> RequestClass:
        return self.claimed.job.request_class

    @property
    def engine_request_id(self) -> str:
        # NOTE: the lease token makes every attempt a distinct engine request: after a lost
        # lease this replica may claim the same job again while the old attempt is still
        # being aborted, and the engine refuses duplicate ids.
        return f"{self.job_id}#{self.token}"

    @property
    def stopping(self) -> bool:
        return self.cancel_requested or self.fenced or self.handed_back

    @property
    def abortable(self) -> bool:
        return not self.finishing and not self.stopping
