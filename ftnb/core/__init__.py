"""The core: records, the pure policy, and (as the layout moves) the controller. Nothing in
``ftnb.core`` touches a process or a machine; executors own those (ARCHITECTURE.md, principle 5).
"""
