"""fairqueue schema revision fq0018 (fairqueue/sql/migrations/v0018_up.sql): the floors wait only for
this database's transactions."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0022_claim_spread")]
    operations = [apply_version("fq0018")]
