# PLACEHOLDER: another branch writes the real 0019_run_phase; drop this file at the merge.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("agentrun", "0018_run_cancelling_index")]

    operations = []
