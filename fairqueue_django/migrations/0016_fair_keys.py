"""fairqueue schema revision fq0012 (fairqueue/sql/migrations/v0012_up.sql): fair keys, turns within a
channel's turn."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0015_channel_active")]
    operations = [apply_version("fq0012")]
