"""fairqueue schema version 3 (fairqueue/sql/migrations/v0003_up.sql; Alembic revision fq0003): periodic schedules."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0003_admin_models")]
    operations = [apply_version("fq0003")]
