"""PeriodicSchedule.resumed_at: the column schema revision fq0007 added (the model had not followed;
tests/django/test_models.py now compares every model with its table). The model is unmanaged,
so this changes Django's migration state only, never the database."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0010_revision_mark")]
    operations = [
        migrations.AddField(
            model_name="periodicschedule",
            name="resumed_at",
            field=models.DateTimeField(null=True),
        ),
    ]
