"""fairqueue schema version 2 (fairqueue/sql/migrations/v0002_up.sql; Alembic revision fq0002)."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0001_initial")]
    operations = [apply_version("fq0002")]
