from django.db import models


class Order(models.Model):
    tenant = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    confirmed = models.BooleanField(default=False)
