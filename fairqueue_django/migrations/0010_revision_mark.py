"""fairqueue schema revision fq0008 (fairqueue/sql/migrations/v0008_up.sql): the schema records its
revision in its comment."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0009_paused_ticks")]
    operations = [apply_version("fq0008")]
