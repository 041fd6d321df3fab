"""A database backend built on Django's PostgreSQL one, as PostGIS or django-tenants are (ENGINE
"tests.django_pg_backend"): fairqueue's checks must take it for PostgreSQL."""
