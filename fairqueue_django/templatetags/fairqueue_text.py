"""``{% load fairqueue_text %}``: ``{{ value|visible }}`` shows a name, a worker's info or an error
with its control characters made visible (fairqueue.text.visible), as every page of the admin does."""

from __future__ import annotations

from typing import Any

from django import template

from fairqueue.text import visible as _visible

register = template.Library()


@register.filter
def visible(value: Any) -> Any:
    """``value`` as text with its control characters written as escapes; None stays None."""
    return None if value is None else _visible(str(value))
