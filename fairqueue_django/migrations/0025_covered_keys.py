"""fairqueue schema revision fq0020 (fairqueue/sql/migrations/v0020_up.sql): a job added to a fair key
already in turn needs no wakeup."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0024_limit_sets")]
    operations = [apply_version("fq0020")]
