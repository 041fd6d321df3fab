"""fairqueue schema revision fq0023 (fairqueue/sql/migrations/v0023_up.sql): a claim starts the jobs its intake
handed their shared limits' slots in idle channels itself, and the intake runs a step only when a probe finds
work for it (functions only; no table changes)."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0028_limit_edit_lock")]
    operations = [apply_version("fq0023")]
