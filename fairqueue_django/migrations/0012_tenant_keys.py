"""fairqueue schema revision fq0009 (fairqueue/sql/migrations/v0009_up.sql): unique and FIFO keys belong
to their channel; names hold no control characters; a job depends only on earlier jobs."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0011_periodic_resumed_at")]
    operations = [apply_version("fq0009")]
