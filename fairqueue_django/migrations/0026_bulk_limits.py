"""fairqueue schema revision fq0021 (fairqueue/sql/migrations/v0021_up.sql): bulk enqueue takes shared
limits; periodic jobs take their task's priority and limits."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0025_covered_keys")]
    operations = [apply_version("fq0021")]
