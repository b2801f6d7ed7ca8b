"""Running compactions: the compactor's top floor.

``runner`` (the inside of one run against storage and its publish; ``run_tally`` counts its
progress and figures, ``run_log`` logs it), ``runs`` (the one executor of runs: slots,
queue, tasks, persisted status, shared by the REST trigger, the scheduler and
``compact-topic``), ``run_state`` (the run state machine: events in, actions out),
``status`` (the persisted status of each topic's last run), ``scheduler`` (when to compact)
and ``lag`` (what is too young to compact).

This floor may import every other part of the compactor (the Spark engine only lazily,
inside ``runner``); nothing of the compactor imports it. Importing the package loads
nothing of it.
"""
