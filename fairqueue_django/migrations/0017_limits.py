"""fairqueue schema revision fq0013 (fairqueue/sql/migrations/v0013_up.sql): a cap per fair key; shared
limits."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0016_fair_keys")]
    operations = [apply_version("fq0013")]
