import fairqueue


@fairqueue.task(name="orders.confirm", max_attempts=5)
def confirm(order_id: int) -> str:
    from orders.models import Order

    Order.objects.filter(pk=order_id).update(confirmed=True)
    return f"order {order_id} confirmed"
