"""fairqueue schema revision fq0010 (fairqueue/sql/migrations/v0010_up.sql): priority within a channel,
and a job's trace context."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0013_fifo_waiting_channel")]
    operations = [apply_version("fq0010")]
