"""fairqueue schema revision fq0016 (fairqueue/sql/migrations/v0016_up.sql): a job whose shared limit's
row is busy joins the limit's line through limit_release."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0019_limit_names")]
    operations = [apply_version("fq0016")]
