"""fairqueue schema revision fq0014 (fairqueue/sql/migrations/v0014_up.sql): a claim never serves a
channel whose turn moved under it."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0017_limits")]
    operations = [apply_version("fq0014")]
