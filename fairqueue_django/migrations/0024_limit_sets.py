"""fairqueue schema revision fq0019 (fairqueue/sql/migrations/v0019_up.sql): shared limits hand out
slots and join lines a set at a time."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0023_floor_database")]
    operations = [apply_version("fq0019")]
