"""The shared limits' tables in Django's state (unmanaged: fq0013 and fq0016 created them): the admin's
shared limits page, and the jobs in a limit's line, which a live job's status counts as waiting."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fairqueue", "0020_limit_inbox")]

    operations = [
        migrations.CreateModel(
            name="LimitWaiting",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("limit_name", models.TextField()),
                ("channel", models.TextField()),
                ("attempt", models.IntegerField()),
                ("rank", models.SmallIntegerField()),
            ],
            options={"db_table": 'fairqueue"."limit_waiting', "managed": False, "default_permissions": ()},
        ),
        migrations.CreateModel(
            name="SharedLimit",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("max_concurrency", models.IntegerField(null=True)),
                ("rate_limit", models.TextField(null=True)),
                ("rate_per_second", models.FloatField(null=True)),
                ("rate_burst", models.FloatField()),
                ("tokens", models.FloatField()),
                ("tokens_at", models.DateTimeField()),
                ("held", models.IntegerField()),
                ("due_at", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "shared limit",
                "db_table": 'fairqueue"."shared_limit',
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="LimitRelease",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("limit_name", models.TextField()),
                ("n", models.IntegerField()),
                ("job_id", models.BigIntegerField(null=True)),
                ("attempt", models.IntegerField(null=True)),
            ],
            options={"db_table": 'fairqueue"."limit_release', "managed": False, "default_permissions": ()},
        ),
    ]
