"""fairqueue schema revision fq0024 (fairqueue/sql/migrations/v0024_up.sql): the intake locks the channels it
wakes in a statement of its own and reads them after, so no key is put in turn in a channel a claimer idled
meanwhile (functions only; no table changes)."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0029_direct_handout")]
    operations = [apply_version("fq0024")]
