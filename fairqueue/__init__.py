"""fairqueue: a fair, multi-tenant job queue in PostgreSQL.

Enqueue inside your own transaction; workers serve channels (tenants) round-robin, within each
channel's concurrency cap, rate limit and weight. See README.md and docs/.
"""

from fairqueue.bulk import BatchResult, BulkEnqueueError, abulk_enqueue, bulk_enqueue
from fairqueue.channels import (
    ChannelSettings,
    LimitSettings,
    aupdate_channel,
    aupdate_limit,
    update_channel,
    update_limit,
)
from fairqueue.config import settings
from fairqueue.consumer import (
    ClaimedJob,
    Finished,
    Outcome,
    acancel,
    aretry,
    cancel,
    claim_batch,
    complete,
    deregister_worker,
    ensure_partitions,
    fail,
    finish,
    heartbeat,
    recover_expired_workers,
    register_worker,
    release,
    retry,
)
from fairqueue.errors import (
    ConfigurationError,
    DuplicateJobError,
    FairqueueError,
    InvalidChannelConfigError,
    InvalidJobError,
    UnknownWorkerError,
    UnsupportedConnectionError,
)
from fairqueue.inspection import ChannelInfo, JobInfo, aget_job, get_job, list_channels
from fairqueue.periodic import periodic
from fairqueue.producer import (
    JobSpec,
    aconfigure_channel,
    aconfigure_limit,
    aenqueue,
    aenqueue_many,
    configure_channel,
    configure_limit,
    enqueue,
    enqueue_many,
)
from fairqueue.tasks import Backoff, JobCancelled, JobContext, JobTimeout, Task, registry, task

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "BatchResult",
    "BulkEnqueueError",
    "ChannelInfo",
    "ChannelSettings",
    "ClaimedJob",
    "ConfigurationError",
    "DuplicateJobError",
    "FairqueueError",
    "Finished",
    "InvalidChannelConfigError",
    "InvalidJobError",
    "JobCancelled",
    "JobContext",
    "JobInfo",
    "JobSpec",
    "JobTimeout",
    "LimitSettings",
    "Outcome",
    "Task",
    "UnknownWorkerError",
    "UnsupportedConnectionError",
    "__version__",
    "abulk_enqueue",
    "acancel",
    "aconfigure_channel",
    "aconfigure_limit",
    "aenqueue",
    "aenqueue_many",
    "aget_job",
    "aretry",
    "aupdate_channel",
    "aupdate_limit",
    "bulk_enqueue",
    "cancel",
    "claim_batch",
    "complete",
    "configure_channel",
    "configure_limit",
    "deregister_worker",
    "enqueue",
    "enqueue_many",
    "ensure_partitions",
    "fail",
    "finish",
    "get_job",
    "heartbeat",
    "list_channels",
    "periodic",
    "recover_expired_workers",
    "register_worker",
    "registry",
    "release",
    "retry",
    "settings",
    "task",
    "update_channel",
    "update_limit",
]
