"""fairqueue schema revision fq0022 (fairqueue/sql/migrations/v0022_up.sql): shared limits changed in part
(configure_limit takes a settings lock, for update_limit) and removed (remove_limit)."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0027_shared_limit_change_permission")]
    operations = [apply_version("fq0022")]
