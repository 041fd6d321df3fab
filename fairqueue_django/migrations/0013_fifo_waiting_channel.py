"""FifoWaiting.channel: the column schema revision fq0009 added (FIFO keys belong to their channel).
The model is unmanaged, so this changes Django's migration state only, never the database."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0012_tenant_keys")]
    operations = [
        migrations.AddField(
            model_name="fifowaiting", name="channel", field=models.TextField(default="default"), preserve_default=False
        ),
    ]
