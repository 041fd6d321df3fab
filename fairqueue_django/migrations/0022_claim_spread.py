"""fairqueue schema revision fq0017 (fairqueue/sql/migrations/v0017_up.sql): a claim's share of the busy
channels is rounded down."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0021_shared_limit_models")]
    operations = [apply_version("fq0017")]
