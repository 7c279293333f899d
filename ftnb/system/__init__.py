"""What the operating system tells about processes and machines, in one place below every other
layer: reading ``/proc`` (a process's state and start time, this machine's identity) and ending a
process once it is proven to be the one meant (:mod:`.processes`).

Storage, the lifecycle and the executors ask here; none of them reads ``/proc`` itself. Ending a
*tree* of processes (an attempt's cgroup, its marked descendants) is execution's job
(:mod:`ftnb.execution.process_tree`), built on these primitives.
"""
