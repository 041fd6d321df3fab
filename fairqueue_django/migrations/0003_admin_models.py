"""Models of fairqueue's tables for the admin (fairqueue_django/models.py).

Every model is unmanaged (or a proxy): this migration only records them in Django's migration state
and runs no SQL (``manage.py sqlmigrate fairqueue 0003`` prints none). The tables themselves come
from fairqueue's SQL migrations (0001, 0002), the same DDL as the Alembic revisions.
"""

from django.db import migrations, models

import fairqueue_django.models


class Migration(migrations.Migration):
    dependencies = [
        ("fairqueue", "0002_retry_roles"),
    ]

    operations = [
        migrations.CreateModel(
            name="Channel",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("weight", models.IntegerField()),
                ("max_concurrency", models.IntegerField(blank=True, null=True)),
                ("rate_limit", models.TextField(blank=True, null=True)),
                ("rate_per_second", models.FloatField(null=True)),
                ("rate_burst", models.FloatField(verbose_name="burst")),
                ("paused", models.BooleanField()),
                ("active", models.BooleanField()),
                ("running", models.IntegerField(verbose_name="running (capped channels)")),
                ("vtime", models.FloatField(verbose_name="virtual time")),
                ("served_at", models.DateTimeField()),
                ("tokens", models.FloatField()),
                ("tokens_at", models.DateTimeField()),
                ("throttled_until", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField()),
                ("eligible", models.BooleanField()),
            ],
            options={
                "db_table": 'fairqueue"."channel',
                "managed": False,
                "default_permissions": ("view", "change"),
            },
        ),
        migrations.CreateModel(
            name="CompletedJob",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False, verbose_name="job")),
                ("attempt", models.IntegerField()),
                (
                    "outcome",
                    models.TextField(
                        choices=[
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("timed_out", "timed out"),
                            ("lost", "lost"),
                            ("cancelled", "cancelled"),
                            ("dependency_failed", "dependency failed"),
                        ]
                    ),
                ),
                ("final", models.BooleanField()),
                ("kind", models.TextField()),
                ("channel", models.TextField()),
                ("args", models.JSONField(null=True)),
                ("result", models.JSONField(null=True)),
                ("error", models.TextField(null=True)),
                ("worker_id", models.BigIntegerField(null=True, verbose_name="worker")),
                ("unique_key", models.TextField(null=True)),
                ("fifo_key", models.TextField(null=True, verbose_name="FIFO key")),
                ("enqueued_at", models.DateTimeField()),
                ("ready_at", models.DateTimeField(null=True)),
                ("started_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "finished attempt",
                "verbose_name_plural": "finished attempts (history)",
                "db_table": 'fairqueue"."completed_job',
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="FifoWaiting",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("fifo_key", models.TextField()),
            ],
            options={
                "db_table": 'fairqueue"."fifo_waiting',
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("kind", models.TextField()),
                ("channel", models.TextField()),
                ("args", models.JSONField()),
                ("max_attempts", models.IntegerField()),
                ("timeout_seconds", models.FloatField(null=True, verbose_name="timeout (seconds)")),
                ("unique_key", models.TextField(null=True)),
                ("fifo_key", models.TextField(null=True, verbose_name="FIFO key")),
                ("depends_on", fairqueue_django.models.BigIntArrayField(null=True)),
                ("run_at", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField(verbose_name="enqueued at")),
            ],
            options={
                "verbose_name": "live job",
                "verbose_name_plural": "live jobs",
                "db_table": 'fairqueue"."job',
                "permissions": [
                    ("cancel_job", "Can cancel jobs"),
                    ("retry_job", "Can retry jobs that ended without succeeding"),
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id", "depends_on", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("depends_on", models.BigIntegerField()),
            ],
            options={
                "db_table": 'fairqueue"."job_dependency',
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="RunningJob",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("channel", models.TextField()),
                ("attempt", models.IntegerField()),
                ("worker_id", models.BigIntegerField(null=True)),
                ("ready_at", models.DateTimeField()),
                ("started_at", models.DateTimeField(null=True)),
                ("cancel_requested", models.BooleanField()),
            ],
            options={
                "db_table": 'fairqueue"."running_job',
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="ScheduledJob",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("channel", models.TextField()),
                ("run_at", models.DateTimeField()),
                ("attempt", models.IntegerField()),
            ],
            options={
                "db_table": 'fairqueue"."scheduled_job',
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("name", models.TextField()),
                ("info", models.JSONField()),
                ("started_at", models.DateTimeField()),
                ("heartbeat_at", models.DateTimeField()),
                ("lease_expires_at", models.DateTimeField()),
            ],
            options={
                "db_table": 'fairqueue"."worker',
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="QueueOverview",
            fields=[],
            options={
                "verbose_name": "queue overview",
                "verbose_name_plural": "queue overview",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("fairqueue.channel",),
        ),
    ]
