from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "agentrun_bench"
    verbose_name = "django-agentrun benchmarks"
