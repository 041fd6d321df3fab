from django.db import transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import fairqueue_django
from orders.models import Order
from orders.tasks import confirm


@csrf_exempt  # an API endpoint, to try with curl; keep CSRF protection for browser forms
@require_POST
def checkout(request, tenant):
    with transaction.atomic():
        order = Order.objects.create(tenant=tenant, total=request.POST.get("total", "0"))
        job_id = confirm.using(channel=tenant).enqueue(fairqueue_django.connection(), order.pk)
    return JsonResponse({"order": order.pk, "job": job_id})
