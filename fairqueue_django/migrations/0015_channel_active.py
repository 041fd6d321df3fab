"""fairqueue schema revision fq0011 (fairqueue/sql/migrations/v0011_up.sql): held snapshots slow neither
producers (channel_active) nor claims (the fair order's floor)."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0014_priorities")]
    operations = [apply_version("fq0011")]
