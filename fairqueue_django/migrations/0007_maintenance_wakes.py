"""fairqueue schema version 5 (fairqueue/sql/migrations/v0005_up.sql; Alembic revision fq0005): the maintenance
role's intake notifies idle workers."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0006_bulk")]
    operations = [apply_version("fq0005")]
