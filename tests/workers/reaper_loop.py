"""The reaper as a process of its own (what beat plus a worker amount to), for tests that
kill things at random: `python -m tests.workers.reaper_loop INTERVAL`.

Standard Django setup from the environment (DJANGO_SETTINGS_MODULE, the test database
name); runs `reap()` every INTERVAL seconds until killed.
"""

from __future__ import annotations

import logging
import sys
import time


def main(interval: float) -> None:
    import django

    django.setup()
    from django.db import close_old_connections

    from django_agentrun.recovery import reap

    log = logging.getLogger("django_agentrun.reaper_loop")
    while True:
        try:
            reap()
        except Exception:  # noqa: BLE001 - a killed database backend: try again next time
            log.warning("reap() failed", exc_info=True)
            close_old_connections()
            from django.db import connection

            connection.close()
        time.sleep(interval)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
