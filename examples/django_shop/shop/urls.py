from django.contrib import admin
from django.urls import path

from orders.views import checkout

urlpatterns = [path("admin/", admin.site.urls), path("checkout/<str:tenant>/", checkout)]
