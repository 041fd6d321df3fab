"""fairqueue schema revision fq0015 (fairqueue/sql/migrations/v0015_up.sql): producers check shared
limit names before writing anything."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0018_claim_order")]
    operations = [apply_version("fq0015")]
