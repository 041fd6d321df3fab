"""fairqueue schema version 6 (fairqueue/sql/migrations/v0006_up.sql; Alembic revision fq0006): claims share a
busy channel instead of waiting for its row, and finish skips follow-ups nothing needs."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0007_maintenance_wakes")]
    operations = [apply_version("fq0006")]
