"""What every page of fairqueue's admin shares: the base ModelAdmin (nothing added or deleted, crafted
input refused, actions run item by item), the limits of an action, and how values are shown."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.utils import quote
from django.core.exceptions import BadRequest, ValidationError
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from fairqueue.errors import FairqueueError
from fairqueue.text import first_line, visible
from fairqueue_django import conf

#: The most jobs or channels one action changes (a "select all" over a huge filter is refused).
MAX_ACTION_ITEMS = 1000
#: Up to this many selected items get one message each; beyond it, one message per outcome.
ITEM_MESSAGES = 25

EMPTY = "-"
BOTH_PLACES = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]


# -- display helpers -----------------------------------------------------------------------------------


# Names, keys, errors and worker infos are shown with their control characters made visible
# (fairqueue.text.visible): stored before the schema refused them, or free text, they would otherwise
# be invisible, or make two different names look the same.


def shown(field: str, description: str | None = None) -> Callable[[Any], str]:
    """A list column or read-only field that shows model field ``field`` as text, its control
    characters made visible, and sorts by it. It is named after the field, so its column keeps the
    field's CSS class (``field-name``)."""

    def show(obj: Any) -> str:
        value = getattr(obj, field)
        return EMPTY if value is None or value == "" else visible(str(value))

    show.__name__ = show.__qualname__ = field
    return admin.display(description=description or field.replace("_", " "), ordering=field)(show)


def pretty_json(value: Any) -> SafeString | str:
    """Indented JSON in a <pre>, escaped (JSON escapes C0 controls; DEL and C1 are made visible)."""
    if value is None:
        return EMPTY
    text = visible(json.dumps(value, indent=2, ensure_ascii=False), keep_newlines=True)
    return format_html('<pre class="fairqueue-json">{}</pre>', text)


def preformatted(text: str | None) -> SafeString | str:
    """A text of several lines (an error and its traceback) in a <pre>, escaped, control characters
    other than line feeds made visible."""
    if text is None:
        return EMPTY
    return format_html('<pre class="fairqueue-text">{}</pre>', visible(text, keep_newlines=True))


def seconds(value: timedelta | None) -> str:
    return EMPTY if value is None else f"{value.total_seconds():.1f}s"


def error_summary(head: str | None, tail: str | None = None) -> str:
    """One line for an error: its first line, or for a Python traceback its last (the exception).
    ``head`` and ``tail`` are the start and the end of the text (the whole text for both is fine)."""
    line = first_line(head) or ""
    if line.startswith("Traceback (most recent call last)"):
        last = next((x.strip() for x in reversed((tail or head or "").splitlines()) if x.strip()), line)
        line = last
    return visible(line[:200])


def local_time(value: datetime | None) -> str:
    """A time to the second, in the current time zone (the admin's default format stops at minutes)."""
    if value is None:
        return EMPTY
    if timezone.is_aware(value):  # naive ones (USE_TZ = False) are TIME_ZONE's wall clock already
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def aware(value: datetime) -> datetime:
    """A time read from the database as an aware one (with USE_TZ = False Django reads naive times,
    TIME_ZONE's wall clock)."""
    return timezone.make_aware(value, timezone.get_default_timezone()) if timezone.is_naive(value) else value


def time_field(name: str, description: str) -> Any:
    """A read-only column or field showing model field ``name`` with :func:`local_time`."""

    @admin.display(description=description, ordering=name)
    def show(self: Any, obj: Any) -> str:
        return local_time(getattr(obj, name))

    return show


def admin_link(viewname: str, key: Any, text: Any) -> SafeString:
    return format_html('<a href="{}">{}</a>', reverse(viewname, args=[quote(key)]), text)


def job_id_term(term: str) -> int | None:
    """The search term as a job id, if it is one (bigint range)."""
    term = term.strip()
    if re.fullmatch(r"[0-9]{1,19}", term) and 0 < int(term) < 2**63:
        return int(term)
    return None


# -- shared admin behaviour ---------------------------------------------------------------------------


def has_nul(request: HttpRequest) -> bool:
    """Whether a parameter of the request holds a NUL character (PostgreSQL text cannot: any query
    with it fails)."""
    return any(
        "\x00" in key or any("\x00" in value for value in values)
        for params in (request.GET, request.POST)
        for key, values in params.lists()
    )


class QueueAdmin(admin.ModelAdmin):
    """Nothing is added or deleted, lists are never counted twice, and no facet counts (each would be
    another COUNT over the queue).

    Crafted input gets a 4xx, not a 500: a NUL character in a list's parameters (which no text
    column can hold) is a bad request, an object address with one is no object, and action
    selections that are not keys of the model are refused."""

    show_facets = admin.ShowFacets.NEVER
    show_full_result_count = False
    list_per_page = 50

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if has_nul(request):
            raise BadRequest("a parameter holds a NUL character")
        return super().changelist_view(request, extra_context)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if "\x00" in object_id:
            return None
        return super().get_object(request, object_id, from_field)

    def response_action(self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any) -> Any:
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                self.opts.pk.to_python(value)
            except ValidationError as exc:
                raise BadRequest("a selected item is not a key of this list") from exc
        return super().response_action(request, queryset, *args, **kwargs)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _per_item(
        self,
        request: HttpRequest,
        items: Sequence[Any],
        operation: Callable[[Any], str],
        texts: dict[str, tuple[int, str]],
        label: Callable[[Any], str],
    ) -> list[tuple[Any, str | None]]:
        """Runs ``operation`` on each item in its own transaction and tells the user what happened:
        one message per item, or per outcome for a big selection. Returns (item, state or None)."""
        alias = conf.get().database
        results: list[tuple[Any, str | None]] = []
        summary: Counter[tuple[int, str]] = Counter()
        for item in items:
            state: str | None
            try:
                with transaction.atomic(using=alias):
                    state = operation(item)
            except (DatabaseError, FairqueueError) as exc:
                state, level, text = None, messages.ERROR, f"failed: {visible(first_line(str(exc)) or '')}"
            else:
                level, text = texts.get(state, (messages.INFO, state))
            results.append((item, state))
            if len(items) <= ITEM_MESSAGES:
                self.message_user(request, f"{label(item)}: {text}", level)
            else:
                summary[(level, text)] += 1
        for (level, text), n in sorted(summary.items()):
            self.message_user(request, f"{n} of {len(items)}: {text}", level)
        return results

    def _too_many(self, request: HttpRequest, count: int, noun: str) -> bool:
        if count > MAX_ACTION_ITEMS:
            self.message_user(
                request,
                f"More than {MAX_ACTION_ITEMS} {noun} selected: nothing was changed. Narrow the list with a filter.",
                messages.ERROR,
            )
            return True
        return False
