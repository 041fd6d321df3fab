"""The admin changes shared limits (its form saves with fairqueue.configure_limit): the model gets Django's
"change" permission. Django state only: the database schema does not change."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0026_bulk_limits")]
    operations = [
        migrations.AlterModelOptions(
            name="sharedlimit",
            options={
                "default_permissions": ("view", "change"),
                "managed": False,
                "verbose_name": "shared limit",
            },
        ),
    ]
