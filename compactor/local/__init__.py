"""The local engine: both compaction phases on this machine.

The pure core: ``algorithm`` (phase one and two over entries), ``keymap`` (the bounded key
map), ``chunks`` (where chunked messages complete), ``scan`` (the phases' lean entry
reader), ``rounds`` (a run in rounds that fit the key map). The key index beside sealed
ledgers: ``key_index`` (the Parquet file), ``indexed`` (a round read from indexes),
``index_source`` (which ranges have one), ``index_builds`` (building them off the hot
path). ``worker`` runs rounds in a worker process, off the broker's interpreter.

This floor imports the compactor's shared ground (``compactor.errors``, ``engine``,
``record``, ``throttle``), ``compactor.view`` (the compacted entry format) and below; never
the runs nor Spark. Importing the package loads nothing of it.
"""
