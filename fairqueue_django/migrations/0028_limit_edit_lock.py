"""fairqueue schema revision fq0022 (fairqueue/sql/migrations/v0022_up.sql): configure_limit takes the limit's
settings lock, for update_limit."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0027_shared_limit_change_permission")]
    operations = [apply_version("fq0022")]
