"""fairqueue schema version 7 (fairqueue/sql/migrations/v0007_up.sql; Alembic revision fq0007): ticks that fell
due while a periodic schedule was paused stay missed after it is resumed, and a claim never shares a
channel whose limits configure_channel is changing."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0008_shared_claims")]
    operations = [apply_version("fq0007")]
