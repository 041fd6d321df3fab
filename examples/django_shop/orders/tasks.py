import fairqueue


@fairqueue.task(name="orders.confirm", max_attempts=5, pass_context=True)
def confirm(ctx, order_id: int) -> str:
    from orders.models import Order

    ctx.atomic()  # the update below commits together with the job's success: exactly once
    Order.objects.filter(pk=order_id).update(confirmed=True)
    return f"order {order_id} confirmed"
