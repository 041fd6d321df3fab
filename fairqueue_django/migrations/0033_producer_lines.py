"""fairqueue schema revision fq0027 (fairqueue/sql/migrations/v0027_up.sql): a job that is ready but for its
shared limits joins the line of its first limit in its producer's transaction while that limit has a line,
and an intake that finds a limit's row busy lines the job up the same way; limit_release gains a column."""

from django.db import migrations, models

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0032_configure_wait")]
    operations = [
        apply_version("fq0027"),
        # LimitRelease is unmanaged: Django's migration state only
        migrations.AddField(model_name="limitrelease", name="channel", field=models.TextField(null=True)),
    ]
