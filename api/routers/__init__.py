"""The admin REST routers, one module per resource; each only parses, calls the core, shapes.

* ``topics`` — list, create, delete topics; delete a subscription.
* ``compaction`` — trigger a run, read its status.
* ``offload`` — offload a topic's sealed ledgers to the bucket, read its status.
* ``policies`` — the compaction policies of topics and namespaces.
* ``stats`` — topic stats, internal stats, Prometheus metrics.
* ``permissions`` — produce/consume grants of roles on namespaces and topics.
* ``schemas`` — topic schemas and the schema compatibility strategy.
* ``backup`` — a backup of the running broker's data dir.
* ``subscriptions`` — list, peek, reset, clear the backlog; unload; last message id.
* ``partitions`` — partitioned topics: create, metadata, grow, delete, list, stats.
* ``tenants`` — clusters, tenants, namespaces, and the HTTP lookup.

``common`` holds what they share: the ``Admin`` dependency, path parameters and the
documented error answers.
"""

from api.routers.backup import router as backup_router
from api.routers.compaction import router as compaction_router
from api.routers.offload import router as offload_router
from api.routers.partitions import router as partitions_router
from api.routers.permissions import router as permissions_router
from api.routers.policies import router as policies_router
from api.routers.schemas import router as schemas_router
from api.routers.stats import router as stats_router
from api.routers.subscriptions import router as subscriptions_router
from api.routers.tenants import router as tenants_router
from api.routers.topics import router as topics_router

__all__ = ["ROUTERS"]

ROUTERS = (topics_router, compaction_router, offload_router, policies_router, stats_router, permissions_router,
           schemas_router, backup_router, subscriptions_router, partitions_router, tenants_router)
