"""fairqueue schema version 4 (fairqueue/sql/migrations/v0004_up.sql; Alembic revision fq0004): bulk enqueue ledger."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0005_periodic_schedule_model")]
    operations = [apply_version("fq0004")]
