"""Django integration for fairqueue (app, migrations, admin, runworker, django.tasks backend).

Its contents arrive with the Django issue; until then this package only marks the place.
"""
