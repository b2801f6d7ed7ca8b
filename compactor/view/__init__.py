"""The compacted view: what read-compacted readers see of a topic.

``view`` (the compacted ledgers' entry format, ``CompactedEntry``, and ``CompactedView``,
one immutable value per publish), ``manifest`` (which ledgers make each view, and the
replaced ones awaiting their grace period), ``topic`` (a topic's compaction state: its
``__compaction`` cursor and its published view), ``reader`` (one subscription's
read-compacted state over the view and its cursor).

This floor imports the compactor's shared ground (``compactor.errors``, ``compactor.record``)
and below (``message``, ``cursor``, ``ledger``); neither engine nor the runs. Importing the
package loads nothing of it.
"""
