"""fairqueue schema revision fq0026 (fairqueue/sql/migrations/v0026_up.sql): configure_channel changing a
channel's cap per fair key waits for the channel's producers before it takes the channel's row, so
claims keep serving the channel meanwhile; a function replaced, no table changed."""

from django.db import migrations

from fairqueue_django.schema import apply_version


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0031_key_slots")]
    operations = [apply_version("fq0026")]
