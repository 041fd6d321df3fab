"""fairqueue schema revision fq0025 (fairqueue/sql/migrations/v0025_up.sql): in a channel without a cap per
fair key, the keys take turns by slots their ready jobs carry (running_job.key_slot), so a claim reads one
index range per channel and keeps no row per key; new columns on running_job, channel and channel_active."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0030_wake_snapshot")]
    operations = [apply_version("fq0025")]
