"""fairqueue schema version 1 (fairqueue/sql/migrations/v0001_up.sql; Alembic revision fq0001)."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [apply_version("fq0001")]
