"""The Spark tests bind Spark to the loopback interface: a machine whose host name resolves
to a loopback address otherwise makes Spark guess an external one (and warn)."""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
